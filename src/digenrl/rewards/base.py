"""Reward function interface and weighted composition.

A reward function maps decoded images (float in [0, 1], [B, C, H, W] or video [B, C, F, H, W]) and their
prompts to one score per sample. ``WeightedSum`` composes several: r = sum_k w_k r_k, keeping each part for
logging.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import torch

from digenrl.rollout.records import Prompt


class RewardFn(Protocol):
    name: str

    def __call__(self, images: torch.Tensor, prompts: Sequence[Prompt]) -> torch.Tensor: ...


class WeightedSum:
    """r = sum_k w_k * r_k(images, prompts); ``parts`` returns each r_k too."""

    def __init__(self, parts: dict[str, tuple[float, RewardFn]]):
        if not parts:
            raise ValueError("reward: at least one reward function is required")
        self._parts = parts
        self.name = "+".join(parts)

    def score(self, images: torch.Tensor, prompts: Sequence[Prompt]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        values = {name: fn(images, prompts).float().cpu() for name, (_, fn) in self._parts.items()}
        total = sum(self._parts[name][0] * v for name, v in values.items())
        return total, values

    def __call__(self, images: torch.Tensor, prompts: Sequence[Prompt]) -> torch.Tensor:
        return self.score(images, prompts)[0]
