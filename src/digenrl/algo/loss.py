"""Per-timestep clipped policy-gradient loss (PPO-style, as in Flow-GRPO) and the KL-to-reference term.

For one cell (generation i, trained timestep t)::

    r    = exp(logp_theta - logp_old)
    loss = max(-A r, -A clip(r, 1 - eps, 1 + eps))

Statistics: ``approx_kl = 0.5 * mean((logp_theta - logp_old)^2)`` and ``clipfrac = mean(|r - 1| > eps)``.

KL to the reference policy between two Gaussians with the same std (the transition std ``sigma_t`` of the SDE
step, i.e. ``s_t * sqrt(-dt)``)::

    KL(theta || ref) = mean((mean_theta - mean_ref)^2) / (2 sigma_t^2)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PolicyLossStats:
    approx_kl: torch.Tensor
    clipfrac: torch.Tensor
    ratio_mean: torch.Tensor


def clipped_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    clip_range: float,
) -> tuple[torch.Tensor, PolicyLossStats]:
    """Element-wise clipped loss (no reduction) and detached statistics (reduced means)."""
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    loss = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        stats = PolicyLossStats(
            approx_kl=0.5 * (log_ratio**2).mean(),
            clipfrac=((ratio - 1.0).abs() > clip_range).float().mean(),
            ratio_mean=ratio.mean(),
        )
    return loss, stats


def gaussian_kl(mean: torch.Tensor, ref_mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Per-sample KL between N(mean, std^2) and N(ref_mean, std^2), averaged over non-batch dims."""
    kl = (mean - ref_mean) ** 2 / (2 * std**2)
    return kl.mean(dim=tuple(range(1, kl.ndim)))
