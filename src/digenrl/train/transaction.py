"""The per-minibatch gradient transaction.

Between ``begin(step, expected_cells)`` and ``commit()`` gradients only accumulate (each trained cell is
``record``-ed, and a cell trained twice is refused: invariant I2). ``commit`` refuses an incomplete minibatch,
sums the gradients over the trainer ranks (one all-reduce per parameter, the only gradient sync; under hybrid
sharding, one of the gradient shards across the shard groups), multiplies
them by ``grad_scale`` (a deferred loss scale, e.g. B / kept trajectories when zero-advantage samples are
filtered), clips, takes one optimizer step and clears the gradients. A step trained as M minibatches
(docs/architecture.md, "Minibatches") opens and commits M transactions; only the last one (``final=True``, the default) bumps the policy
version, so the weights are published as version k+1 after the M-th optimizer step. ``abort`` drops
everything, so no partial minibatch is ever committed.

Before the optimizer step ``commit`` checks that the minibatch's loss (when the caller passes it) and the total
gradient norm (after the all-reduce and ``grad_scale``; the same value on every rank) are finite. If not, the
commit is refused: the gradients are dropped, the optimizer is not stepped (weights and AdamW state unchanged),
the transaction is closed and ``NonFiniteCommit`` names the step. One NaN gradient would otherwise make every
weight NaN. An fp16 overflow is not a fault: dynamic loss scaling skips that step and backs off (``precision``).

**Order-free sums** (``train.grad_sum``, ``fp64``; why: docs/algorithms.md, "Reproducible sums": two clean runs
of hybrid sharding ended 1e-6 .. 3e-5 apart in 10 steps; which runs: ``control.run_plan.grad_sum_fp64``): the
caller ``fold`` s each chunk's gradient into float64 sums right after its backward; the commit all-reduces those
in float64 and casts them back. A sum of float32 values in float64 is exact while their exponents span less than
29 - log2(n) bits; past that its rounding (2^-53 relative) changes the float32 result only where the exact sum
lies that close to a float32 rounding boundary, so the committed gradient, and the run, are the same bitwise
whatever the order and the partition (``tests/runtime/test_grad_sum.py``). The sums cost 8 bytes per trainable
parameter (sharded: per shard) beside the float32 gradient (``train.memory``).
"""

from __future__ import annotations

import math
from typing import Hashable, Iterable

import torch

from digenrl.faults import RunHalted
from digenrl.schedule import step_number


class TransactionError(RuntimeError):
    pass


class NonFiniteCommit(RunHalted):
    """A commit refused because its loss or gradient norm is not finite (the optimizer was not stepped)."""


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
        self.replica_group = None  # hybrid sharding: the ranks holding the same shards in the other shard groups
        self.fp64 = False  # train.grad_sum=fp64: ``fold`` each chunk's gradient into float64 sums (module docstring)
        self._sums: list | None = None
        self.step: int | None = None
        self._expected: set[Hashable] | None = None
        self._done: set[Hashable] = set()

    @property
    def open(self) -> bool:
        return self.step is not None

    def begin(self, step: int, expected_cells: Iterable[Hashable] | None = None) -> None:
        if self.open:
            raise TransactionError(f"transaction for step {step_number(self.step)} is still open")
        self.step = step
        self._expected = None if expected_cells is None else set(expected_cells)
        self._done = set()
        self._sums = None
        self.optimizer.zero_grad(set_to_none=True)

    def fold(self) -> None:
        """``fp64``: add the gradients now in ``.grad`` (the chunk just trained) to the float64 sums and clear
        them, so the next chunk's backward starts from none; without ``fp64`` nothing (autograd accumulates)."""
        if not self.fp64 or not self.open:
            return
        if self._sums is None:
            self._sums = [None] * len(self.params)
        for i, p in enumerate(self.params):
            if p.grad is not None:
                g = p.grad.to(torch.float64)
                self._sums[i] = g if self._sums[i] is None else self._sums[i].add_(g)
                p.grad = None

    def record(self, cells: Iterable[Hashable]) -> None:
        if not self.open:
            raise TransactionError("record() outside a transaction")
        for c in cells:
            if c in self._done:
                raise TransactionError(f"step {step_number(self.step)}: cell {c} trained twice")
            if self._expected is not None and c not in self._expected:
                raise TransactionError(f"step {step_number(self.step)}: cell {c} is not part of this step")
            self._done.add(c)

    def missing(self) -> set[Hashable]:
        return set() if self._expected is None else self._expected - self._done

    def commit(self, *, check_complete: bool = True, grad_scale: float = 1.0, final: bool = True,
               loss: float | None = None) -> dict[str, float]:
        """One optimizer step for the open minibatch; returns {"grad_norm": ...}.

        ``final=False`` keeps the version (a minibatch other than the step's last). ``loss``: the minibatch's
        loss, checked with the gradient norm (``NonFiniteCommit`` if either is not finite: nothing is stepped).
        """
        if not self.open:
            raise TransactionError("commit() outside a transaction")
        if check_complete and self.missing():
            raise TransactionError(f"step {step_number(self.step)}: refusing to commit, {len(self.missing())} "
                                   "cells untrained")
        if self.fp64:
            self.fold()  # what a caller left in .grad (a deferred round's combined heads)
            sums, self._sums = self._sums or [None] * len(self.params), None
            sums = [g if g is not None else torch.zeros_like(p, dtype=torch.float64) for p, g in zip(self.params, sums)]
            self._all_reduce(sums)
            for p, g in zip(self.params, sums):
                p.grad = g.to(p.dtype)  # (.grad takes the parameter's dtype only)
        else:
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
        if finite:  # clip (max_norm inf: measure only); the total norm is the same on every rank
            limit = self.max_grad_norm if self.max_grad_norm is not None else math.inf
            norm = torch.nn.utils.clip_grad_norm_(self.params, limit)
            norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # (FSDP: a DTensor)
            bad = None if math.isfinite(norm) else f"gradient norm is {norm}"
            if loss is not None and not math.isfinite(loss):
                bad = f"loss is {loss}" + (f" and {bad}" if bad else "")
            if bad:
                step = self.step
                self.abort()
                raise NonFiniteCommit(f"step {step_number(step)}: {bad}; refusing to commit (the optimizer was not "
                                      "stepped, the weights are those of the last commit)")
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
        self._sums = None

    def _all_reduce(self, sums: list | None = None) -> None:
        """Sum the gradients (or ``sums``, one tensor per parameter: the float64 sums) over the trainer ranks:
        unsharded, one all-reduce per parameter over ``process_group``; FSDP, nothing left (the backward
        reduce-scattered them within the shard group), except under hybrid sharding, where each rank all-reduces
        its gradient shards over ``replica_group`` (the same shard of every shard group): sum over groups of the
        per-group sums = the sum over all ranks' cells."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return
        group = self.replica_group if self.sharded else self.process_group
        if (self.sharded and group is None) or dist.get_world_size(group) == 1:
            return
        for i, p in enumerate(self.params):
            if sums is None and p.grad is None:  # this rank (group) trained no cell of the round: it adds zeros
                p.grad = torch.zeros_like(p)
            t = p.grad if sums is None else sums[i]
            dist.all_reduce(t.to_local() if hasattr(t, "to_local") else t, op=dist.ReduceOp.SUM, group=group)
