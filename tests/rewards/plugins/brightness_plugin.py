"""A reward plug-in living outside the package (used by tests/rewards/test_plugins.py).

r = -|mean(image[channel]) - target|, with a per-sample breakdown of the mean brightness.
"""

from __future__ import annotations

from typing import Sequence

import torch


class Brightness:
    def __init__(self, target: float, channel: int):
        self.name, self.target, self.channel = "brightness", target, channel

    def score(self, images: torch.Tensor, prompts: Sequence) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mean = images[:, self.channel].flatten(1).mean(dim=1)
        return -(mean - self.target).abs(), {"mean": mean}

    def __call__(self, images: torch.Tensor, prompts: Sequence) -> torch.Tensor:
        return self.score(images, prompts)[0]


def build_brightness(target: float = 0.5, channel: int = 0) -> Brightness:
    if not 0.0 <= target <= 1.0:
        raise ValueError(f"reward brightness: target must be in [0, 1], got {target}")
    return Brightness(target, channel)
