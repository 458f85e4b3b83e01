"""Reward function interface and weighted composition.

A reward function maps decoded images (float in [0, 1], [B, C, H, W] or video [B, C, F, H, W]) and their
prompts (``Prompt``: ``uid``, ``text``, ``meta`` -- e.g. GenEval's object metadata) to one score per sample,
a float tensor [B] on any device. It may also define ``score(images, prompts) -> (scores, info)`` where
``info`` maps names to per-sample tensors [B] (a breakdown or diagnostics, logged as ``reward/<name>/<key>``).

``WeightedSum`` composes several: r = sum_k w_k r_k, keeping each r_k (and each part's own breakdown, as
``"<name>/<key>"``) for logging.
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
        values: dict[str, torch.Tensor] = {}
        extra: dict[str, torch.Tensor] = {}
        for name, (_, fn) in self._parts.items():
            if hasattr(fn, "score"):
                v, info = fn.score(images, prompts)
                for key, part in info.items():
                    if key != name:
                        extra[f"{name}/{key}"] = part.float().cpu().reshape(-1)
            else:
                v = fn(images, prompts)
            values[name] = v.float().cpu().reshape(-1)
        total = sum(self._parts[name][0] * v for name, v in values.items())
        return total, {**values, **extra}

    def __call__(self, images: torch.Tensor, prompts: Sequence[Prompt]) -> torch.Tensor:
        return self.score(images, prompts)[0]
