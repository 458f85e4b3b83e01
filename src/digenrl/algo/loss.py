"""Per-timestep clipped policy-gradient loss (PPO-style, as in Flow-GRPO) and the KL-to-reference term.

For one cell (generation i, trained timestep t)::

    r    = exp(logp_theta - logp_old)
    loss = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))

(``eps_low = eps_high = clip_range`` unless an asymmetric range is asked for, as Flow-GRPO's
``clip_range_lt`` / ``clip_range_gt``.) Statistics, as Flow-GRPO logs them:
``approx_kl = 0.5 * mean((logp_theta - logp_old)^2)``, ``clipfrac = mean(|r - 1| > eps)``,
``clipfrac_gt_one = mean(r - 1 > eps_high)`` and ``clipfrac_lt_one = mean(1 - r > eps_low)``.

KL to the reference policy between two Gaussians with the same std. Flow-GRPO's form (the default,
``form="flow_grpo"``) divides by its ``std_dev_t`` s_t, the diffusion coefficient::

    KL(theta || ref) = mean((mean_theta - mean_ref)^2) / (2 s_t^2)

The exact KL of the transition (``form="exact"``) divides by the transition variance ``s_t^2 (-dt)`` instead,
i.e. it is the Flow-GRPO value divided by ``-dt`` (for ``cps`` the two coincide: its std_dev_t is the transition
std).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

KL_FORMS = ("flow_grpo", "exact")


@dataclass
class PolicyLossStats:
    approx_kl: torch.Tensor
    clipfrac: torch.Tensor
    clipfrac_gt_one: torch.Tensor
    clipfrac_lt_one: torch.Tensor


def clipped_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    clip_range: float,
    *,
    clip_low: float | None = None,
    clip_high: float | None = None,
) -> tuple[torch.Tensor, PolicyLossStats]:
    """Element-wise clipped loss (no reduction) and detached statistics (reduced means)."""
    low = clip_range if clip_low is None else clip_low
    high = clip_range if clip_high is None else clip_high
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    loss = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        stats = PolicyLossStats(
            approx_kl=0.5 * (log_ratio**2).mean(),
            clipfrac=((ratio - 1.0).abs() > clip_range).float().mean(),
            clipfrac_gt_one=(ratio - 1.0 > high).float().mean(),
            clipfrac_lt_one=(1.0 - ratio > low).float().mean(),
        )
    return loss, stats


def gaussian_kl(mean: torch.Tensor, ref_mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Per-sample mean((mean - ref_mean)^2) / (2 std^2), averaged over non-batch dims.

    With ``std`` = Flow-GRPO's std_dev_t this is Flow-GRPO's KL; with the transition std it is the exact KL
    between N(mean, std^2) and N(ref_mean, std^2). A zero ``std`` (an ODE step) gives 0.
    """
    safe = torch.where(std > 0, std, torch.ones_like(std))
    kl = (mean - ref_mean) ** 2 / (2 * safe**2)
    kl = kl.mean(dim=tuple(range(1, kl.ndim)))
    return torch.where((std > 0).reshape(-1), kl, torch.zeros_like(kl))


def reference_kl(out, ref_mean: torch.Tensor, form: str = "flow_grpo") -> torch.Tensor:
    """KL of an ``SDEStepOutput`` ``out`` to the reference mean in ``form`` units (module docstring)."""
    if form not in KL_FORMS:
        raise ValueError(f"train.kl_form must be one of {KL_FORMS}, got {form!r}")
    return gaussian_kl(out.mean, ref_mean, out.std_dev_t if form == "flow_grpo" else out.std)
