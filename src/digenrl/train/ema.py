"""Exponential moving average of the trainable parameters (used for evaluation, as Flow-GRPO does).

After optimizer step n (n = 1, 2, ... counts commits, i.e. Flow-GRPO's ``global_step`` after it is bumped),
if ``(n + 1) % every == 0``::

    d_n = min((1 + n) / (10 + n), decay)      (Flow-GRPO's ``EMAModuleWrapper`` warm-up; ``warmup=False``: decay)
    ema <- d_n * ema + (1 - d_n) * theta

Flow-GRPO's SD3 / FLUX scripts use decay 0.9 and ``update_step_interval=8``. (They call the EMA once per
sampled train batch, so with gradient accumulation over k batches the same n is applied k times to unchanged
weights; here it is applied once per optimizer step.) Only trainable tensors are shadowed (LoRA adapters under
LoRA), so a 12B model with LoRA does not get a second copy. ``swapped()`` temporarily loads the EMA values into
the policy (e.g. for eval) and restores them after.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


class ParamEMA:
    def __init__(self, module: torch.nn.Module, decay: float, *, every: int = 1, warmup: bool = True):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"train.ema_decay must be in [0, 1), got {decay}")
        if every < 1:
            raise ValueError(f"train.ema_every must be >= 1, got {every}")
        self.decay, self.every, self.warmup = decay, every, warmup
        self.num_updates = 0  # optimizer steps seen (Flow-GRPO's global_step)
        self.params = {n: p for n, p in module.named_parameters() if p.requires_grad}
        self.shadow = {n: p.detach().clone() for n, p in self.params.items()}

    def current_decay(self, n: int) -> float:
        return min((1 + n) / (10 + n), self.decay) if self.warmup else self.decay

    @torch.no_grad()
    def update(self) -> None:
        """Call after every optimizer step (commit)."""
        self.num_updates += 1
        n = self.num_updates
        if (n + 1) % self.every != 0:
            return
        d = self.current_decay(n)
        for name, p in self.params.items():
            self.shadow[name].add_((1.0 - d) * (p.detach() - self.shadow[name]))

    @contextmanager
    def swapped(self):
        backup = {n: p.detach().clone() for n, p in self.params.items()}
        with torch.no_grad():
            for n, p in self.params.items():
                p.copy_(self.shadow[n])
        try:
            yield
        finally:
            with torch.no_grad():
                for n, p in self.params.items():
                    p.copy_(backup[n])
