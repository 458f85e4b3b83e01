"""Reward plug-ins that return bad values (used by tests/rewards/test_reward_boundary.py and tests/cli/test_nonfinite.py).

``build_faulty(kind, from_call, index)``: a reward of the mean brightness per sample, correct for the first
``from_call - 1`` calls and then wrong in the way ``kind`` says: ``nan`` / ``inf`` (sample ``index`` only),
``column`` ([B, 1] instead of [B]), ``short`` (one score too few), ``int`` (an integer tensor), ``list`` (not a
tensor).
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch


class Faulty:
    def __init__(self, kind: str, from_call: int, index: int):
        self.name, self.kind, self.from_call, self.index = "faulty", kind, from_call, index
        self.calls = 0

    def __call__(self, images: torch.Tensor, prompts: Sequence):
        self.calls += 1
        r = images.flatten(1).float().mean(dim=1)
        if self.calls < self.from_call:
            return r
        if self.kind in ("nan", "inf"):
            r = r.clone()
            r[min(self.index, len(r) - 1)] = float(self.kind)
            return r
        if self.kind == "column":
            return r[:, None]
        if self.kind == "short":
            return r[:-1]
        if self.kind == "int":
            return (r * 10).long()
        return r.tolist()


def build_faulty(kind: Literal["nan", "inf", "column", "short", "int", "list"] = "nan", from_call: int = 1,
                 index: int = 0) -> Faulty:
    return Faulty(kind, from_call, index)
