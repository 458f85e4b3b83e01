"""Typed records of prompts and trajectories.

A ``TrajectoryBatch`` holds N trajectories (any mix of prompt groups) with their tensors stacked along dim 0:
the latents entering and leaving every *trained* step, the behaviour log-probs of those transitions, and the
metadata a step needs (docs/architecture.md) (prompt uid, generation index, seed, policy version, reward, advantage).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import torch


@dataclass(frozen=True)
class Prompt:
    """One prompt. ``uid`` identifies its group; ``meta`` carries task data (e.g. the digits it names)."""

    uid: int
    text: str
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


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
    keep: torch.Tensor | None = None  # [N] bool: the samples that train and count (train.zero_adv_refill); None: A != 0

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def uids(self) -> torch.Tensor:
        return torch.tensor([p.uid for p in self.prompts], dtype=torch.long)

    def select(self, idx: Sequence[int] | torch.Tensor) -> "TrajectoryBatch":
        idx_t = torch.as_tensor(idx, dtype=torch.long)
        pick = lambda t: None if t is None else t[idx_t]  # noqa: E731
        return replace(
            self,
            prompts=[self.prompts[i] for i in idx_t.tolist()],
            gen_index=self.gen_index[idx_t],
            step=self.step[idx_t],
            version=self.version[idx_t],
            seed=self.seed[idx_t],
            latents=self.latents[idx_t],
            next_latents=self.next_latents[idx_t],
            log_probs=self.log_probs[idx_t],
            final=self.final[idx_t],
            images=pick(self.images),
            rewards=pick(self.rewards),
            reward_parts=None if self.reward_parts is None else {k: v[idx_t] for k, v in self.reward_parts.items()},
            advantages=pick(self.advantages),
            means=pick(self.means),
            keep=pick(self.keep),
        )

    @staticmethod
    def cat(batches: Sequence["TrajectoryBatch"]) -> "TrajectoryBatch":
        if not batches:
            raise ValueError("cannot concatenate zero trajectory batches")
        first = batches[0]
        for b in batches[1:]:
            if not torch.equal(b.trained_steps, first.trained_steps) or not torch.equal(b.sigmas, first.sigmas):
                raise ValueError("trajectory batches disagree on sigmas or trained steps")

        def cat_opt(name: str):
            vals = [getattr(b, name) for b in batches]
            return None if any(v is None for v in vals) else torch.cat(vals)

        parts = None
        if all(b.reward_parts is not None for b in batches):
            parts = {k: torch.cat([b.reward_parts[k] for b in batches]) for k in first.reward_parts}
        return TrajectoryBatch(
            prompts=[p for b in batches for p in b.prompts],
            gen_index=torch.cat([b.gen_index for b in batches]),
            step=torch.cat([b.step for b in batches]),
            version=torch.cat([b.version for b in batches]),
            seed=torch.cat([b.seed for b in batches]),
            sigmas=first.sigmas,
            trained_steps=first.trained_steps,
            latents=torch.cat([b.latents for b in batches]),
            next_latents=torch.cat([b.next_latents for b in batches]),
            log_probs=torch.cat([b.log_probs for b in batches]),
            final=torch.cat([b.final for b in batches]),
            images=cat_opt("images"),
            rewards=cat_opt("rewards"),
            reward_parts=parts,
            advantages=cat_opt("advantages"),
            means=cat_opt("means"),
            keep=cat_opt("keep"),
        )
