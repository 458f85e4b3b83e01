"""GRPO-Guard (Wang et al. 2025, "GRPO-Guard: Mitigating Implicit Over-Optimization in Flow Matching via
Regulated Clipping", arXiv 2510.22319): the clipped loss of Flow-GRPO with a normalised importance ratio and a
per-timestep gradient reweighting.

For one cell (generation i, trained timestep t) of a Gaussian SDE step (``sde.kind`` ``flow_grpo`` or
``dance``) with transition std ``sigma = s_t sqrt(-dt)``, the behaviour mean ``mu_old`` (recorded when the
trajectory was sampled) and the current mean ``mu_theta``::

    log r      = logp_theta - logp_old                       (both averaged over the latent's elements)
    bias       = mean((mu_theta - mu_old)^2) / (2 sigma^2)
    log r_norm = sigma * (log r + bias)                      (RatioNorm)
    r_norm     = exp(log r_norm)
    loss       = max(-A r_norm, -A clip(r_norm, 1 - eps_low, 1 + eps_high)) / (-dt)    (gradient reweight)

Why: with x' = mu_old + sigma eps, log r = mean(eps (mu_theta - mu_old)) / sigma - bias. Its mean over the
noise is -bias < 0 (the ratio is biased below 1, most at low-noise steps) and its spread scales with 1 / sigma
(it differs by an order of magnitude across steps). Adding ``bias`` centres it at 0 and multiplying by sigma
gives ``mean(eps (mu_theta - mu_old))``, on one scale at every step, so one clip range acts alike at every
timestep (flow_grpo's recipes take ``clip_range = 2e-6`` in these units); dividing the step's loss by ``-dt``
rebalances the gradient of the steps. The KL to the reference (``beta_kl``) is left as it is (not reweighted),
as in flow_grpo. Statistics: ``clipfrac*`` of ``r_norm``; ``approx_kl`` of the raw log r.

Source: flow_grpo's ``scripts/train_sd3_GRPO_Guard.py`` (its ``config.rationorm`` branch; recipes in
``config/grpo_guard.py``), read in the fork zhtmike/flow_grpo at 9745241 (GRPO-Guard as its author merged it).

**Which samples share the bias** (``train.guard_bias``; per mode and layout, and why the modes still agree:
docs/algorithms.md, "GRPO-Guard's RatioNorm bias"). flow_grpo computes ``bias`` as
``(...).pow(2).mean(dim=tuple(range(1, log_prob.ndim)))`` with a 1-D ``log_prob``: an empty tuple of dims, which
torch reads as "every dim", so one bias for the whole per-device batch of that timestep (its micro-batch of
``sample.train_batch_size`` samples, all at timestep j, so they share sigma)::

    bias_j = mean_{i in batch, elements} (mu_theta,i - mu_old,i)^2 / (2 sigma_j^2)

``batch`` (the default) does the same with ``units``: every sample of one forward that shares a unit label (the
trained timestep of the cell: ``train.chunk_loss`` passes the cells' trained positions, one group per forward,
so one sigma per label) gets the mean of the per-sample biases of its label, which is bias_j above: the batch is
"what one device forwards together at one timestep", as in flow_grpo, with DigenRL's forwards.
``cell`` gives each cell its own bias (the formula above, as the paper derives it per sample), the same in every
mode and layout.
"""

from __future__ import annotations

import torch

from digenrl.algo.loss import PolicyLossStats, clipped_policy_loss


def _per_sample(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], -1)[:, 0] if t.ndim > 1 else t


def normalized_log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor, mean: torch.Tensor,
                         old_mean: torch.Tensor, std: torch.Tensor, units: torch.Tensor | None = None) -> torch.Tensor:
    """RatioNorm's ``sigma (log r + bias)`` per sample ([B]); ``std`` is the transition std, [B] or broadcastable
    to the sample ([B, 1, ...]). ``units`` None: each sample's own bias mean((mu_theta - mu_old)^2) / (2 sigma^2);
    else [B] labels, and each sample gets the mean bias of the samples with its label (flow_grpo's batch mean,
    module docstring; the samples of one label must share sigma)."""
    sigma = _per_sample(std).to(log_prob.dtype)
    sq = (mean - old_mean.to(mean.dtype)) ** 2
    bias = sq.mean(dim=tuple(range(1, sq.ndim))) / (2 * sigma**2)
    if units is not None:
        _, idx = torch.unique(units.to(bias.device), return_inverse=True)
        sums = torch.zeros(int(idx.max()) + 1, dtype=bias.dtype, device=bias.device).index_add(0, idx, bias)
        bias = (sums / torch.bincount(idx).to(bias.dtype))[idx]
    return sigma * (log_prob - old_log_prob + bias)


def guard_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    mean: torch.Tensor,
    old_mean: torch.Tensor,
    std: torch.Tensor,
    dt: torch.Tensor,
    advantages: torch.Tensor,
    clip_range: float,
    *,
    clip_low: float | None = None,
    clip_high: float | None = None,
    units: torch.Tensor | None = None,
) -> tuple[torch.Tensor, PolicyLossStats]:
    """Element-wise GRPO-Guard loss (no reduction, module docstring) and its detached statistics; ``units``: the
    batch-mean bias's labels (``normalized_log_ratio``), None for the per-cell bias."""
    lr = normalized_log_ratio(log_prob, old_log_prob, mean, old_mean, std, units)
    loss, stats = clipped_policy_loss(lr, torch.zeros_like(lr), advantages, clip_range, clip_low=clip_low,
                                      clip_high=clip_high)
    with torch.no_grad():
        stats.approx_kl = 0.5 * ((log_prob - old_log_prob) ** 2).mean()
    return loss / (-_per_sample(dt).to(loss.dtype)), stats
