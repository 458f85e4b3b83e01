"""Exponential moving average of the trainable parameters (used for evaluation, as Flow-GRPO does).

    ema <- decay * ema + (1 - decay) * theta         after every commit

Only trainable tensors are shadowed (LoRA adapters under LoRA), so a 12B model with LoRA does not get a second
copy. ``swapped()`` temporarily loads the EMA values into the policy (e.g. for eval) and restores them after.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


class ParamEMA:
    def __init__(self, module: torch.nn.Module, decay: float):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"train.ema_decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.params = {n: p for n, p in module.named_parameters() if p.requires_grad}
        self.shadow = {n: p.detach().clone() for n, p in self.params.items()}

    @torch.no_grad()
    def update(self) -> None:
        for n, p in self.params.items():
            self.shadow[n].lerp_(p.detach(), 1.0 - self.decay)

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
