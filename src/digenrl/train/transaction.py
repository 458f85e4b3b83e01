"""The per-minibatch gradient transaction.

Between ``begin(step, expected_cells)`` and ``commit()`` gradients only accumulate (each trained cell is
``record``-ed, and a cell trained twice is refused: invariant I2). ``commit`` refuses an incomplete minibatch,
sums the gradients over the trainer ranks (one all-reduce per parameter, the only gradient sync), multiplies
them by ``grad_scale`` (a deferred loss scale, e.g. B / kept trajectories when zero-advantage samples are
filtered), clips, takes one optimizer step and clears the gradients. A step trained as M minibatches
(docs/architecture.md, "Minibatches") opens and commits M transactions; only the last one (``final=True``, the default) bumps the policy
version, so the weights are published as version k+1 after the M-th optimizer step. ``abort`` drops
everything, so no partial minibatch is ever committed.
"""

from __future__ import annotations

from typing import Hashable, Iterable

import torch


class TransactionError(RuntimeError):
    pass


class GradientTransaction:
    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        optimizer: torch.optim.Optimizer,
        *,
        max_grad_norm: float | None = None,
        version: int = 0,
        process_group=None,
        precision=None,
    ):
        self.params = [p for p in params if p.requires_grad]
        self.optimizer = optimizer
        self.max_grad_norm = max_grad_norm
        self.version = version
        self.process_group = process_group
        self.precision = precision  # train.precision.Precision: fp16 unscale / skip / scale update at commit
        self.sharded = False  # FSDP (train.sharding): every chunk's backward already reduce-scattered the grads
        self.step: int | None = None
        self._expected: set[Hashable] | None = None
        self._done: set[Hashable] = set()

    @property
    def open(self) -> bool:
        return self.step is not None

    def begin(self, step: int, expected_cells: Iterable[Hashable] | None = None) -> None:
        if self.open:
            raise TransactionError(f"transaction for step {self.step} is still open")
        self.step = step
        self._expected = None if expected_cells is None else set(expected_cells)
        self._done = set()
        self.optimizer.zero_grad(set_to_none=True)

    def record(self, cells: Iterable[Hashable]) -> None:
        if not self.open:
            raise TransactionError("record() outside a transaction")
        for c in cells:
            if c in self._done:
                raise TransactionError(f"step {self.step}: cell {c} trained twice")
            if self._expected is not None and c not in self._expected:
                raise TransactionError(f"step {self.step}: cell {c} is not part of this step")
            self._done.add(c)

    def missing(self) -> set[Hashable]:
        return set() if self._expected is None else self._expected - self._done

    def commit(self, *, check_complete: bool = True, grad_scale: float = 1.0, final: bool = True) -> dict[str, float]:
        """One optimizer step for the open minibatch; returns {"grad_norm": ...}.

        ``final=False`` keeps the version (a minibatch other than the step's last).
        """
        if not self.open:
            raise TransactionError("commit() outside a transaction")
        if check_complete and self.missing():
            raise TransactionError(f"step {self.step}: refusing to commit, {len(self.missing())} cells untrained")
        self._all_reduce()
        finite = True
        if self.precision is not None:
            finite = self.precision.unscale_and_check(self.params, self.process_group)
            self.precision.update(finite)
        if finite and grad_scale != 1.0:
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(grad_scale)
        norm = float("nan")
        if finite and self.max_grad_norm is not None:
            norm = float(_full(torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)))
        if finite:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if final:
            self.version += 1
        self.step = None
        return {"grad_norm": norm}

    def abort(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.step = None
        self._done = set()

    def _all_reduce(self) -> None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(self.process_group) == 1:
            return
        if self.sharded:
            return
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=self.process_group)


def _full(t):
    """A DTensor (FSDP total norm) as a plain tensor."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t
