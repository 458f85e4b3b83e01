"""A reward plug-in that raises (tests/cli/test_errors_after_validation.py): mean brightness for the first
``from_call - 1`` calls, then ``RuntimeError`` (a bug in the plug-in, or an input it cannot handle)."""

from __future__ import annotations

from typing import Sequence

import torch


class Raising:
    def __init__(self, from_call: int):
        self.name, self.from_call, self.calls = "raising", from_call, 0

    def __call__(self, images: torch.Tensor, prompts: Sequence) -> torch.Tensor:
        self.calls += 1
        if self.calls >= self.from_call:
            raise RuntimeError(f"plug-in kaput on call {self.calls}")
        return images.flatten(1).float().mean(dim=1)


def build_raising(from_call: int = 1) -> Raising:
    return Raising(from_call)
