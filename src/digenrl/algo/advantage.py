"""Group-relative advantages (GRPO).

For reward r_i of generation i in prompt group g::

    A_i = clip((r_i - baseline) / (std + eps), -adv_clip_max, adv_clip_max)

* ``baseline``: the group mean (``baseline="group"``, Flow-GRPO's per-prompt stat tracking, DanceGRPO's
  ``use_group``) or the mean of the whole step (``baseline="batch"``: Flow-GRPO with
  ``per_prompt_stat_tracking=False``, DanceGRPO without ``use_group``);
* ``std``: of the group (``std_mode="group"``) or of the whole step's rewards (``std_mode="global"``, Flow-GRPO's
  ``sample.global_std``); the population std (numpy's, Flow-GRPO) or the unbiased one (``unbiased=True``:
  torch's default, DanceGRPO, which also uses ``eps = 1e-8``; Flow-GRPO uses ``eps = 1e-4``).

A group whose rewards are all equal (std below ``zero_std_tol``) carries no learning signal: it is counted in
``zero_std_ratio``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AdvantageStats:
    zero_std_ratio: float


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    std_mode: str = "group",
    eps: float = 1e-4,
    adv_clip_max: float = 5.0,
    zero_std_tol: float = 1e-6,
    baseline: str = "group",
    unbiased: bool = False,
) -> tuple[torch.Tensor, AdvantageStats]:
    """Advantages for ``rewards`` [N] whose prompt group is ``group_ids`` [N] (any integer labels)."""
    if std_mode not in ("group", "global"):
        raise ValueError(f"std_mode must be 'group' or 'global', got {std_mode!r}")
    if baseline not in ("group", "batch"):
        raise ValueError(f"baseline must be 'group' or 'batch', got {baseline!r}")
    rewards = rewards.to(torch.float64)
    adv = torch.empty_like(rewards)
    groups = torch.unique(group_ids)
    zero = 0
    gstd, gmean = float(rewards.std(unbiased=unbiased)), float(rewards.mean())
    for g in groups:
        m = group_ids == g
        r = rewards[m]
        s = float(r.std(unbiased=unbiased)) if len(r) > 1 else 0.0
        if s < zero_std_tol:
            zero += 1
        denom = s if std_mode == "group" else gstd
        base = r.mean() if baseline == "group" else gmean
        adv[m] = (r - base) / (denom + eps)
    adv = adv.clamp(-adv_clip_max, adv_clip_max)
    return adv.to(torch.float32), AdvantageStats(zero_std_ratio=zero / max(len(groups), 1))
