"""Per-trajectory noise (invariant I5, docs/architecture.md).

The initial noise x_T and every SDE step's noise of a trajectory are drawn from a private generator seeded by
``stable_seed(run_seed, step, prompt_uid, generation_index)``, always in the same order (x_T first, then one
draw per denoising step). Which worker, fragment or batch produced the trajectory can therefore never change
its samples.
"""

from __future__ import annotations

import torch

from digenrl.algo.timesteps import stable_seed


def trajectory_seed(run_seed: int, step: int, uid: int, gen: int) -> int:
    return stable_seed(int(run_seed), int(step), int(uid), int(gen))


def trajectory_noise(seed: int, shape: tuple[int, ...], num_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_T [*shape], step noise [num_steps, *shape]) for one trajectory, float32 on CPU."""
    g = torch.Generator().manual_seed(seed)
    x_t = torch.randn(shape, generator=g)
    eps = torch.randn((num_steps, *shape), generator=g)
    return x_t, eps


def group_initial_noise(run_seed: int, step: int, uid: int, shape: tuple[int, ...]) -> torch.Tensor:
    """x_T shared by every generation of a prompt group (``sampler.same_latent``), from (run seed, step, uid)."""
    g = torch.Generator().manual_seed(stable_seed(int(run_seed), int(step), int(uid), "same_latent"))
    return torch.randn(shape, generator=g)
