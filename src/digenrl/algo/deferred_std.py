"""Global reward std for pipelined training: train with a provisional scale, rescale the gradient at commit.

With ``std_mode="global"`` the advantage of generation i of group g is (Flow-GRPO ``sample.global_std``)::

    A_i = clip(lambda * u_i, -c, c),   u_i = r_i - mean_g,   lambda = 1 / (std_step + eps)

where ``std_step`` is the std of *all* the step's rewards, unknown until the last group is scored. A pipelined
trainer that has to start on the first groups can use a provisional ``lambda_0`` (e.g. from the previous step)
and multiply the accumulated gradient by ``lambda / lambda_0`` before the optimizer step
(``GradientTransaction.commit(grad_scale=...)``). This is exact because the clipped policy loss is positively
homogeneous in A: for k > 0, ``max(-kA r, -kA clip(r)) = k max(-A r, -A clip(r))``, so its gradient scales by k.
It is exact only when

* no advantage is clipped at either scale: ``max_i |u_i| * max(lambda, lambda_0) <= c``, and
* the loss has no term that does not scale with A (``beta_kl == 0``: the KL gradient would be rescaled too).

The zero-advantage filter depends only on ``u_i == 0`` and stays exact. ``plan_rescale`` says whether the
rescale is exact for a step and by how much to multiply.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GlobalStdRescale:
    grad_scale: float  # lambda / lambda_0
    exact: bool
    reason: str  # why not exact ("" when exact)


def provisional_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, lambda_0: float, adv_clip_max: float) -> torch.Tensor:
    """clip(lambda_0 * (r - group mean), +-c) for complete groups; what the trainer uses before the step's std."""
    r = rewards.to(torch.float64)
    u = torch.empty_like(r)
    for g in torch.unique(group_ids):
        m = group_ids == g
        u[m] = r[m] - r[m].mean()
    return (lambda_0 * u).clamp(-adv_clip_max, adv_clip_max).to(torch.float32)


def plan_rescale(rewards: torch.Tensor, group_ids: torch.Tensor, lambda_0: float, *, eps: float = 1e-4,
                 adv_clip_max: float = 5.0, beta_kl: float = 0.0, unbiased: bool = False) -> GlobalStdRescale:
    """The commit-time gradient factor for a step whose rewards are now all known (see the module docstring)."""
    if lambda_0 <= 0:
        raise ValueError(f"the provisional scale must be > 0, got {lambda_0}")
    r = rewards.to(torch.float64)
    lam = 1.0 / (float(r.std(unbiased=unbiased)) + eps)
    u_max = 0.0
    for g in torch.unique(group_ids):
        rg = r[group_ids == g]
        u_max = max(u_max, float((rg - rg.mean()).abs().max()))
    reasons = []
    if u_max * max(lam, lambda_0) > adv_clip_max:
        reasons.append(f"an advantage is clipped (max |r - mean_g| = {u_max:.4g}, scales {lambda_0:.4g} / {lam:.4g})")
    if beta_kl > 0:
        reasons.append("beta_kl > 0: the KL gradient does not scale with the advantages")
    return GlobalStdRescale(grad_scale=lam / lambda_0, exact=not reasons, reason="; ".join(reasons))
