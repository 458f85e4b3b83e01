"""One stochastic (or ODE) step of a flow-matching sampler, with the log-probability of the transition.

Convention (docs/architecture.md, "The math"): sigma = 1 is pure noise, sigma = 0 is data; x_sigma = (1 - sigma) x_0 + sigma eps,
and the model predicts the velocity v = eps - x_0, so the Euler ODE step is x' = x + v * dt with
dt = sigma' - sigma < 0.

Kinds
-----
``flow_grpo`` (Flow-GRPO, Liu et al. 2025, eq. for the reverse SDE of a rectified flow)::

    s_t  = a * sqrt(sigma / (1 - sigma))         (sigma' replaces sigma in 1 - sigma when sigma == 1)
    mean = x * (1 + s_t^2 / (2 sigma) * dt) + v * (1 + s_t^2 (1 - sigma) / (2 sigma)) * dt
    std  = s_t * sqrt(-dt)

``dance`` (DanceGRPO): the same drift with a constant diffusion s_t = eta (= ``noise_level``), so
``std = eta * sqrt(-dt)``.  (DanceGRPO writes the drift through the score
-(x - (1 - sigma) x0_hat) / sigma^2 with x0_hat = x - sigma v; expanding it gives exactly the formula above.)

``cps`` (coefficients-preserving sampling)::

    std  = sigma' * sin(a * pi / 2)
    x0   = x - sigma v,  eps_hat = x + (1 - sigma) v
    mean = (1 - sigma') x0 + sqrt(sigma'^2 - std^2) eps_hat

In every kind ``x' = mean + std * noise``. For ``flow_grpo`` and ``dance`` ``log p(x' | x)`` is the Gaussian
log-density ``-(x' - mean)^2 / (2 std^2) - log std - log sqrt(2 pi)``; for ``cps`` it is Flow-GRPO's
constant-free surrogate ``-(x' - mean)^2`` (its ``sde_type="cps"`` branch drops every constant and the 1/(2 std^2)
factor, so its clip ranges are in those units). Both are averaged over all non-batch dimensions.
``noise_level = 0`` gives the deterministic Euler ODE step ``x + v dt`` (std = 0, log_prob = 0).

The output also carries ``std_dev_t`` (Flow-GRPO's fourth return value): the diffusion coefficient ``s_t``
(``flow_grpo``), ``eta`` (``dance``) or the transition std itself (``cps``). Flow-GRPO's KL to the reference
divides by ``2 std_dev_t^2`` (docs/architecture.md, "The math"), not by the transition variance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SDE_KINDS = ("flow_grpo", "dance", "cps")


@dataclass
class SDEStepOutput:
    """Result of one sampler step.  ``log_prob`` has one value per batch element."""

    prev_sample: torch.Tensor
    log_prob: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor  # transition std, broadcastable to the sample, shape [B, 1, ...]
    std_dev_t: torch.Tensor  # Flow-GRPO's std_dev_t (s_t; eta for dance; std for cps), shape [B, 1, ...]


def _as_batch(value: torch.Tensor | float, ref: torch.Tensor) -> torch.Tensor:
    """Broadcast a scalar or per-sample value to shape [B, 1, 1, ...] matching ``ref``."""
    t = torch.as_tensor(value, dtype=torch.float64 if ref.dtype == torch.float64 else torch.float32)
    t = t.to(ref.device)
    if t.ndim == 0:
        t = t.expand(ref.shape[0])
    return t.reshape(-1, *([1] * (ref.ndim - 1)))


def sde_step_with_logprob(
    sample: torch.Tensor,
    velocity: torch.Tensor,
    sigma: torch.Tensor | float,
    sigma_next: torch.Tensor | float,
    *,
    noise_level: float,
    kind: str = "flow_grpo",
    prev_sample: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    noise: torch.Tensor | None = None,
) -> SDEStepOutput:
    """Take one step from ``sample`` at ``sigma`` to ``sigma_next`` (see the module docstring).

    Args:
        sample: x at sigma, shape [B, ...] (4-D image or 5-D video latents).
        velocity: model velocity (after CFG), same shape.
        sigma, sigma_next: scalars or per-sample tensors of shape [B].
        noise_level: ``a`` (flow_grpo, cps) or ``eta`` (dance). 0 means the ODE step.
        prev_sample: if given, the log-prob of this transition is computed instead of sampling.
        generator / noise: the source of the step noise when sampling (``noise`` wins). Per-trajectory
            noise (invariant I5, docs/architecture.md) is passed as ``noise``.
    """
    if kind not in SDE_KINDS:
        raise ValueError(f"unknown sde kind {kind!r}; expected one of {SDE_KINDS}")
    compute_dtype = torch.float32 if sample.dtype in (torch.float16, torch.bfloat16) else sample.dtype
    x = sample.to(compute_dtype)
    v = velocity.to(compute_dtype)
    s = _as_batch(sigma, x).to(compute_dtype)
    s_next = _as_batch(sigma_next, x).to(compute_dtype)
    dt = s_next - s

    if noise_level == 0.0:
        mean = x + v * dt
        std = torch.zeros_like(s)
        s_t = std
    elif kind == "cps":
        std = s_next * math.sin(noise_level * math.pi / 2)
        s_t = std
        x0 = x - s * v
        eps_hat = x + (1 - s) * v
        mean = (1 - s_next) * x0 + torch.sqrt((s_next**2 - std**2).clamp_min(0.0)) * eps_hat
    else:
        if kind == "flow_grpo":
            denom_sigma = torch.where(s >= 1.0, s_next, s)
            s_t = noise_level * torch.sqrt(s / (1 - denom_sigma))
        else:  # dance
            s_t = torch.full_like(s, noise_level)
        mean = x * (1 + s_t**2 / (2 * s) * dt) + v * (1 + s_t**2 * (1 - s) / (2 * s)) * dt
        std = s_t * torch.sqrt(-dt)

    if prev_sample is None:
        if noise is None:
            noise = torch.randn(x.shape, generator=generator, device=x.device, dtype=compute_dtype)
        prev = mean + std * noise.to(compute_dtype)
    else:
        prev = prev_sample.to(compute_dtype)

    deterministic = (std == 0).reshape(-1)
    if kind == "cps":
        log_prob = -((prev.detach() - mean) ** 2)
    else:
        safe_std = torch.where(std > 0, std, torch.ones_like(std))
        log_prob = (
            -((prev.detach() - mean) ** 2) / (2 * safe_std**2) - torch.log(safe_std) - 0.5 * math.log(2 * math.pi)
        )
    log_prob = log_prob.mean(dim=tuple(range(1, log_prob.ndim)))
    if noise_level == 0.0 or kind != "cps":
        log_prob = torch.where(deterministic, torch.zeros_like(log_prob), log_prob)
    return SDEStepOutput(prev_sample=prev.to(sample.dtype), log_prob=log_prob, mean=mean, std=std, std_dev_t=s_t)
