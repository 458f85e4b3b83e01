"""Sigma schedules identical to diffusers' ``FlowMatchEulerDiscreteScheduler.set_timesteps``.

Static shift (SD3 uses shift = 3)::

    sigma_shifted = shift * sigma / (1 + (shift - 1) * sigma)

Resolution-dependent ("dynamic") shift (FLUX): with mu a linear function of the image token count,

    mu = base_shift + (max_shift - base_shift) * (seq_len - base_seq_len) / (max_seq_len - base_seq_len)
    sigma_shifted = exp(mu) / (exp(mu) + (1 / sigma - 1))

The unshifted grid is ``linspace(1, 1/N_train, steps)`` where the scheduler's own training grid
(num_train_timesteps = N_train) is first shifted (static case) to find its end points, exactly as diffusers does.
The schedule ends with sigma = 0.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def resolution_shift_mu(
    image_seq_len: int,
    base_seq_len: int = 256,
    max_seq_len: int = 4096,
    base_shift: float = 0.5,
    max_shift: float = 1.15,
) -> float:
    """mu for the resolution-dependent shift (linear in the token count; FLUX defaults)."""
    m = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    return image_seq_len * m + (base_shift - m * base_seq_len)


def flow_match_sigmas(
    num_steps: int,
    *,
    shift: float = 1.0,
    mu: float | None = None,
    num_train_timesteps: int = 1000,
    grid: str = "scheduler",
) -> torch.Tensor:
    """Return ``num_steps + 1`` sigmas from 1 (noise) down to 0 (data), float32.

    If ``mu`` is given the dynamic (exponential) shift is used and ``shift`` is ignored, like diffusers'
    ``use_dynamic_shifting=True``. ``grid="linear"`` starts from ``linspace(1, 1/steps, steps)`` instead of the
    scheduler's own grid, as the FLUX / Wan / Qwen-Image pipelines pass explicitly.
    """
    if grid not in ("scheduler", "linear"):
        raise ValueError(f"grid must be 'scheduler' or 'linear', got {grid!r}")
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    n = num_train_timesteps
    train_sigmas = np.linspace(1, n, n, dtype=np.float32)[::-1].copy() / n
    if mu is None:
        train_sigmas = shift * train_sigmas / (1 + (shift - 1) * train_sigmas)
    sigma_max, sigma_min = float(train_sigmas[0]), float(train_sigmas[-1])
    if grid == "linear":
        sigmas = np.linspace(1.0, 1.0 / num_steps, num_steps).astype(np.float32)
    else:
        sigmas = np.linspace(sigma_max * n, sigma_min * n, num_steps).astype(np.float32) / n
    if mu is None:
        sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
    else:
        sigmas = math.exp(mu) / (math.exp(mu) + (1 / sigmas - 1) ** 1.0)
    out = torch.from_numpy(np.asarray(sigmas, dtype=np.float32))
    return torch.cat([out, torch.zeros(1)])
