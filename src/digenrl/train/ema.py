"""Exponential moving average of the trainable parameters (used for evaluation, as Flow-GRPO does).

After optimizer step n (n = 1, 2, ... counts commits, i.e. Flow-GRPO's ``global_step`` after it is bumped),
if ``(n + 1) % every == 0``::

    d_n = min((1 + n) / (10 + n), decay)      (Flow-GRPO's ``EMAModuleWrapper`` warm-up; ``warmup=False``: decay)
    ema <- d_n * ema + (1 - d_n) * theta

Flow-GRPO's SD3 / FLUX scripts use decay 0.9 and ``update_step_interval=8``.

``train.ema_update`` says how many times the rule runs per optimizer step (``updates`` = k):

* ``per_commit`` (default): k = 1.
* ``per_micro_batch`` (Flow-GRPO): k = P G / (M ``train.micro_batch``), its ``train.gradient_accumulation_steps``
  (``ema_updates_per_commit``). yifan123/flow_grpo@ac4c86e8 ``scripts/train_sd3.py`` calls
  ``ema.step(transformer_trainable_parameters, global_step)`` inside ``for i, sample in
  enumerate(samples_batched)``, after the timestep loop: once per micro-batch of ``sample.train_batch_size``
  samples per GPU, while ``global_step`` is bumped only when ``accelerator.sync_gradients`` (an optimizer step,
  every ``gradient_accumulation_steps`` micro-batches). So the k micro-batch updates of one optimizer step
  all use the same n and the same weights, and the EMA moves by d_n^k: ``ema <- d_n^k ema + (1 - d_n^k) theta``
  (run here as k updates, in Flow-GRPO's order of operations). The count k is fixed by the config, not by
  the runtime's chunking nor by the zero-advantage filter (Flow-GRPO reshapes its kept samples into
  ``num_batches_per_epoch`` micro-batches whatever their number). Flow-GRPO runs the first of the k right
  after its optimizer step and the other k - 1 during the next step's micro-batches (before the weights
  change again); here all k run at the commit, so the two agree at every commit and differ only for an eval
  or checkpoint taken in between (Flow-GRPO's per-epoch eval sees 1 of the k). It is arguably a bug (the
  decay per optimizer step then depends on the accumulation count), hence off by default.

Only trainable tensors are shadowed (LoRA adapters under LoRA), so a 12B model with LoRA does not get a second
copy; ``ParamCopy.swapped`` exchanges them with the policy's (e.g. for eval).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


def reshard(module: torch.nn.Module) -> None:
    """Drop every FSDP2 module's unsharded parameter copy, so that the next forward gathers the weights the
    shards hold now (no-op unsharded). The root keeps its all-gathered weights after a forward (FSDP2 turns
    ``reshard_after_forward`` off for it), so a swap of the shards in place is otherwise not seen by it."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover (a torch without FSDP2)
        return
    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def ema_updates_per_commit(train_cfg) -> int:
    """k of ``train.ema_update``: 1 (``per_commit``), or P G / (M ``train.micro_batch``) (``per_micro_batch``:
    Flow-GRPO's micro-batches per optimizer step; the config checks that it divides)."""
    t = train_cfg
    if t.ema_update == "per_commit":
        return 1
    return t.prompts_per_step * t.generations // (t.minibatches_per_step * t.micro_batch)


def make_ema(module: torch.nn.Module, train_cfg) -> "ParamEMA | None":
    """The run's EMA from its ``train`` config (None when ``train.ema_decay`` is null)."""
    t = train_cfg
    if t.ema_decay is None:
        return None
    return ParamEMA(module, t.ema_decay, every=t.ema_every, warmup=t.ema_warmup, updates=ema_updates_per_commit(t))


class ParamCopy:
    """A copy (``shadow``) of ``module``'s trainable parameters; ``swapped`` exchanges the two in place, tensor by
    tensor (peak extra memory: one tensor), and back on exit, with a ``reshard`` at each exchange. The EMA,
    DiffusionNFT's old policy and the step-start snapshot of ``train.old_logprob``."""

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self.params = {n: p for n, p in module.named_parameters() if p.requires_grad}
        self.shadow = {n: p.detach().clone() for n, p in self.params.items()}

    @contextmanager
    def swapped(self):
        """The module holds the shadow inside the block (and the live weights again after it)."""
        self._exchange()
        try:
            yield
        finally:
            self._exchange()

    @torch.no_grad()
    def _exchange(self) -> None:
        reshard(self.module)
        for name, p in self.params.items():
            s = self.shadow[name]
            tmp = p.detach().clone()
            p.copy_(s)
            s.copy_(tmp)


class ParamEMA(ParamCopy):
    def __init__(self, module: torch.nn.Module, decay: float, *, every: int = 1, warmup: bool = True,
                 updates: int = 1):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"train.ema_decay must be in [0, 1), got {decay}")
        if every < 1:
            raise ValueError(f"train.ema_every must be >= 1, got {every}")
        if updates < 1:
            raise ValueError(f"EMA updates per optimizer step must be >= 1 (train.ema_update), got {updates}")
        self.decay, self.every, self.warmup, self.updates = decay, every, warmup, updates
        self.num_updates = 0  # optimizer steps seen (Flow-GRPO's global_step)
        super().__init__(module)

    @torch.no_grad()
    def update(self) -> None:
        """Call after every optimizer step (commit): ``updates`` times the rule with this step's n."""
        self.num_updates += 1
        n = self.num_updates
        if (n + 1) % self.every != 0:
            return
        d = min((1 + n) / (10 + n), self.decay) if self.warmup else self.decay
        for _ in range(self.updates):
            for name, p in self.params.items():
                self.shadow[name].add_((1.0 - d) * (p.detach() - self.shadow[name]))
