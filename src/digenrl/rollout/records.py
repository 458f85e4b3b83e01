"""Typed records of prompts and trajectories.

A ``TrajectoryBatch`` holds N trajectories (any mix of prompt groups) with their tensors stacked along dim 0:
the latents entering and leaving every *trained* step, the behaviour log-probs of those transitions, and the
metadata a step needs (docs/architecture.md) (prompt uid, generation index, seed, policy version, reward, advantage).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Sequence

import torch


@dataclass(frozen=True)
class Prompt:
    """One prompt. ``uid`` identifies its group; ``meta`` carries task data (e.g. the digits it names)."""

    uid: int
    text: str
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


_SHARED = ("sigmas", "trained_steps")  # TrajectoryBatch fields shared by its trajectories (not per trajectory)


@dataclass
class TrajectoryBatch:
    prompts: list[Prompt]  # one per trajectory
    gen_index: torch.Tensor  # [N] long: generation index inside the prompt group
    step: torch.Tensor  # [N] long: training step the trajectory belongs to
    version: torch.Tensor  # [N] long: policy version that generated it
    seed: torch.Tensor  # [N] long: the trajectory's noise seed (from run seed, step, uid, generation)
    sigmas: torch.Tensor  # [T + 1] shared schedule
    trained_steps: torch.Tensor  # [S] long: indices of the trained denoising steps (nft: the K training slots)
    latents: torch.Tensor  # [N, S, *latent_shape]: x entering each trained step ([N, 0, ...] for nft: x_0 only)
    next_latents: torch.Tensor  # [N, S, *latent_shape]: x leaving each trained step
    log_probs: torch.Tensor  # [N, S]: behaviour log-probs of those transitions
    final: torch.Tensor  # [N, *latent_shape]: x_0
    images: torch.Tensor | None = None  # decoded final samples in [0, 1]
    rewards: torch.Tensor | None = None  # [N]
    reward_parts: dict[str, torch.Tensor] | None = None
    advantages: torch.Tensor | None = None  # [N]
    means: torch.Tensor | None = None  # [N, S, *latent_shape]: behaviour means of those transitions (grpo_guard)

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def uids(self) -> torch.Tensor:
        return torch.tensor([p.uid for p in self.prompts], dtype=torch.long)

    def select(self, idx: Sequence[int] | torch.Tensor) -> "TrajectoryBatch":
        """The trajectories ``idx`` (every per-trajectory field indexed; the schedule is shared)."""
        i = torch.as_tensor(idx, dtype=torch.long)

        def pick(name: str, v):
            if v is None or name in _SHARED:
                return v
            if name == "prompts":
                return [v[j] for j in i.tolist()]
            return {k: x[i] for k, x in v.items()} if name == "reward_parts" else v[i]

        return replace(self, **{f.name: pick(f.name, getattr(self, f.name)) for f in fields(self)})

    @staticmethod
    def cat(batches: Sequence["TrajectoryBatch"]) -> "TrajectoryBatch":
        """The batches' trajectories in order (an optional field is kept only where every batch has it)."""
        if not batches:
            raise ValueError("cannot concatenate zero trajectory batches")
        first = batches[0]
        for b in batches[1:]:
            if not torch.equal(b.trained_steps, first.trained_steps) or not torch.equal(b.sigmas, first.sigmas):
                raise ValueError("trajectory batches disagree on sigmas or trained steps")

        def join(name: str):
            vals = [getattr(b, name) for b in batches]
            if name in _SHARED:
                return vals[0]
            if name == "prompts":
                return [p for v in vals for p in v]
            if any(v is None for v in vals):
                return None
            return {k: torch.cat([v[k] for v in vals]) for k in vals[0]} if name == "reward_parts" else torch.cat(vals)

        return TrajectoryBatch(**{f.name: join(f.name) for f in fields(TrajectoryBatch)})
