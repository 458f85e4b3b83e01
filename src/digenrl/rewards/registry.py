"""Reward registry: ``name -> "module:factory"``, built lazily so optional weights/imports load only when used.

A factory takes keyword options (from the config's ``reward.<name>`` table) and returns a ``RewardFn``.
"""

from __future__ import annotations

import importlib
from typing import Any

from digenrl.rewards.base import RewardFn, WeightedSum

_FACTORIES: dict[str, str] = {
    "digits": "digenrl.rewards.digits:build_digits_reward",
    "jpeg_compressibility": "digenrl.rewards.jpeg:build_jpeg_compressibility",
    "jpeg_incompressibility": "digenrl.rewards.jpeg:build_jpeg_incompressibility",
    "clipscore": "digenrl.rewards.clip_based:build_clipscore",
    "pickscore": "digenrl.rewards.clip_based:build_pickscore",
    "aesthetic": "digenrl.rewards.clip_based:build_aesthetic",
    "remote": "digenrl.rewards.client:build_remote_reward",
}


def register(name: str, target: str) -> None:
    _FACTORIES[name] = target


def reward_names() -> list[str]:
    return sorted(_FACTORIES)


def build_reward(name: str, **options: Any) -> RewardFn:
    target = _FACTORIES.get(name)
    if target is None:
        raise ValueError(f"reward: unknown reward {name!r}; expected one of {reward_names()}")
    module, fn = target.split(":")
    return getattr(importlib.import_module(module), fn)(**options)


def build_weighted(spec: dict[str, dict[str, Any]]) -> WeightedSum:
    """``spec`` = {name: {"weight": w, **options}} -> WeightedSum."""
    parts = {}
    for name, opts in spec.items():
        opts = dict(opts)
        weight = float(opts.pop("weight", 1.0))
        parts[name] = (weight, build_reward(name, **opts))
    return WeightedSum(parts)
