"""Forward + backward of one chunk of cells, accumulated into the open gradient transaction.

For the cells (i, t) of a chunk, packed into one batch (samples and timesteps flattened, conditions
repeated)::

    v        = CFG(v_theta(x_{i,t}, sigma_t, c_i))
    logp     = log N(x_{i,t+1}; mean_theta(x_{i,t}, v), std_t^2)          (``sde_step_with_logprob``)
    L_cell   = max(-A_i r, -A_i clip(r, 1 - eps, 1 + eps)) + beta * KL_t,  r = exp(logp - logp_old)
    backward( loss_scale * sum_cells L_cell )

With ``loss_scale = 1 / (B * S)`` for a step of B trajectories and S trained timesteps the accumulated gradient
is the gradient of the mean cell loss, whatever the chunking: the per-timestep reference of Flow-GRPO.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from digenrl.algo.loss import clipped_policy_loss, gaussian_kl
from digenrl.algo.sde import sde_step_with_logprob
from digenrl.models.base import Policy, guided_velocity
from digenrl.rollout.records import TrajectoryBatch


@dataclass(frozen=True)
class LossSettings:
    clip_range: float = 0.2
    beta_kl: float = 0.0
    cfg_scale: float = 1.0
    noise_level: float = 0.7
    kind: str = "flow_grpo"


@dataclass
class CellStats:
    """Sums over trained cells (divide by ``cells`` for means)."""

    cells: int = 0
    loss: float = 0.0
    approx_kl: float = 0.0
    clipfrac: float = 0.0
    kl: float = 0.0

    def add(self, other: "CellStats") -> "CellStats":
        return CellStats(*(getattr(self, f) + getattr(other, f) for f in ("cells", "loss", "approx_kl", "clipfrac", "kl")))

    def means(self) -> dict[str, float]:
        n = max(self.cells, 1)
        return {"loss": self.loss / n, "approx_kl": self.approx_kl / n, "clipfrac": self.clipfrac / n, "kl": self.kl / n}


def train_cells(
    policy: Policy,
    group: TrajectoryBatch,
    cells: Sequence[tuple[int, int]],
    *,
    settings: LossSettings,
    loss_scale: float,
    ref_policy: Policy | None = None,
) -> CellStats:
    """Accumulate the gradient of ``loss_scale * sum L_cell`` for ``cells`` = (generation, trained position)."""
    if group.advantages is None:
        raise ValueError("cannot train a group before its advantages are computed (invariant I3)")
    row_of = {int(g): r for r, g in enumerate(group.gen_index.tolist())}
    try:
        rows = torch.tensor([row_of[g] for g, _ in cells], dtype=torch.long)
    except KeyError as e:
        raise ValueError(f"cell generation {e} is not in this group") from None
    tpos = torch.tensor([t for _, t in cells], dtype=torch.long)
    device = next(policy.parameters()).device
    x = group.latents[rows, tpos].to(device)
    x_next = group.next_latents[rows, tpos].to(device)
    old_logp = group.log_probs[rows, tpos].to(device)
    adv = group.advantages[rows].to(device)
    step_idx = group.trained_steps[tpos]
    sigma = group.sigmas[step_idx].to(device)
    sigma_next = group.sigmas[step_idx + 1].to(device)
    cond = policy.encode_prompts([group.prompts[r] for r in rows.tolist()])

    v = guided_velocity(policy, x, sigma, cond, settings.cfg_scale)
    out = sde_step_with_logprob(x, v, sigma, sigma_next, noise_level=settings.noise_level, kind=settings.kind, prev_sample=x_next)
    loss, stats = clipped_policy_loss(out.log_prob, old_logp, adv, settings.clip_range)
    kl = torch.zeros_like(loss)
    if settings.beta_kl > 0:
        if ref_policy is None:
            raise ValueError("train.beta_kl > 0 needs a reference policy")
        with torch.no_grad():
            v_ref = guided_velocity(ref_policy, x, sigma, cond, settings.cfg_scale)  # text encoders are frozen
            ref = sde_step_with_logprob(x, v_ref, sigma, sigma_next, noise_level=settings.noise_level, kind=settings.kind, prev_sample=x_next)
        kl = gaussian_kl(out.mean, ref.mean, out.std)
    total = loss + settings.beta_kl * kl
    (total.sum() * loss_scale).backward()
    n = len(cells)
    return CellStats(
        cells=n,
        loss=float(total.detach().sum()),
        approx_kl=float(stats.approx_kl) * n,
        clipfrac=float(stats.clipfrac) * n,
        kl=float(kl.detach().sum()),
    )
