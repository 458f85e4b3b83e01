"""Reward functions (scored on decoded final samples), their registry, and the remote reward service."""

from digenrl.rewards.base import RewardFn, WeightedSum

__all__ = ["RewardFn", "WeightedSum"]
