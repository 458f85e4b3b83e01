"""Group-relative advantages (GRPO).

For reward r_i of generation i in prompt group g::

    A_i = clip((r_i - mean_g) / (std + eps), -adv_clip_max, adv_clip_max)

where ``std`` is the population standard deviation of the group (``std_mode="group"``, Flow-GRPO's default
per-prompt stat tracking) or of the whole step's rewards (``std_mode="global"``). A group whose rewards are all
equal (std below ``zero_std_tol``) carries no learning signal: it is counted in ``zero_std_ratio``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AdvantageStats:
    zero_std_ratio: float
    group_std_mean: float


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    std_mode: str = "group",
    eps: float = 1e-4,
    adv_clip_max: float = 5.0,
    zero_std_tol: float = 1e-6,
    global_std: float | None = None,
) -> tuple[torch.Tensor, AdvantageStats]:
    """Advantages for ``rewards`` [N] whose prompt group is ``group_ids`` [N] (any integer labels).

    ``global_std`` lets a pipelined trainer that sees one group at a time pass the step-wide std (only
    meaningful with ``std_mode="global"``).
    """
    if std_mode not in ("group", "global"):
        raise ValueError(f"std_mode must be 'group' or 'global', got {std_mode!r}")
    rewards = rewards.to(torch.float64)
    adv = torch.empty_like(rewards)
    groups = torch.unique(group_ids)
    zero = 0
    stds = []
    if std_mode == "global":
        gstd = float(rewards.std(unbiased=False)) if global_std is None else float(global_std)
    for g in groups:
        m = group_ids == g
        r = rewards[m]
        s = float(r.std(unbiased=False))
        stds.append(s)
        if s < zero_std_tol:
            zero += 1
        denom = s if std_mode == "group" else gstd
        adv[m] = (r - r.mean()) / (denom + eps)
    adv = adv.clamp(-adv_clip_max, adv_clip_max)
    stats = AdvantageStats(
        zero_std_ratio=zero / max(len(groups), 1),
        group_std_mean=sum(stds) / max(len(stds), 1),
    )
    return adv.to(torch.float32), stats
