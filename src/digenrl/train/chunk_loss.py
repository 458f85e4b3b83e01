"""Forward + backward of one chunk of cells, accumulated into the open gradient transaction.

For the cells (i, t) of a chunk, packed into one batch (samples and timesteps flattened, conditions
repeated)::

    v        = CFG(v_theta(x_{i,t}, sigma_t, c_i))
    logp     = log p(x_{i,t+1} | x_{i,t}) under theta                      (``sde_step_with_logprob``)
    L_cell   = max(-A_i r, -A_i clip(r, 1 - eps_low, 1 + eps_high)) + beta * KL_t,  r = exp(logp - logp_old)
    backward( loss_scale * sum_cells L_cell )

With ``loss_scale = 1 / (B_m * S)`` for a minibatch of B_m trajectories and S trained timesteps the accumulated
gradient is the gradient of the mean cell loss, whatever the chunking: the per-timestep reference of Flow-GRPO.
KL_t is in Flow-GRPO's units by default (``algo.loss.reference_kl``). ``algorithm`` swaps the cell loss:
GRPO-Guard's normalised ratio (``algo.guard``) or DiffusionNFT's forward-process loss on the clean sample
(``_train_nft``, ``algo.nft``: the cell is (generation, training slot j), no log-prob), each with the same
1 / (B_m S) scale and filtering. logp_old, its TIS weight and the generator-trainer mismatch metrics:
``train.old_logprob``.

Zero-advantage filtering (Flow-GRPO drops every sample whose advantage is 0 before training): with
``filter_zero_advantage`` the cells of such samples are dropped before the forward (they still count as done in
the transaction) and the caller divides by the kept trajectories, B_m = kept ones (``step_math.kept_count``). A
caller that masks the cells itself (the trainer with a round's ``sample_masks`` masks, which hold the filter and
``train.zero_adv_refill``'s re-added samples) passes the cells it keeps with the filter off. When no
cell is left, a call alone (``collective=False``) returns without a forward; a rank of a sharded pool
(``collective=True``) trains its first cell with weight 0, ``backward(0 * loss_scale * L_cell(first))``, stats
``CellStats(cells=n, trained=0)`` (``step_math.kept_cells``).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, fields
from typing import Sequence

import torch

from digenrl.algo import nft
from digenrl.algo.guard import guard_policy_loss
from digenrl.algo.loss import clipped_policy_loss, reference_kl
from digenrl.algo.sde import sde_step_with_logprob
from digenrl.models.base import Policy, guided_velocity
from digenrl.rollout.records import TrajectoryBatch
from digenrl.train.nft_old import old_of
from digenrl.train.old_logprob import Mismatch, mismatch, step_start_of, tis_weight
from digenrl.train.step_math import kept_cells, nonzero


@dataclass(frozen=True)
class LossSettings:
    clip_range: float = 0.2
    beta_kl: float = 0.0
    cfg_scale: float = 1.0
    noise_level: float = 0.7
    kind: str = "flow_grpo"
    kl_form: str = "flow_grpo"  # "exact": the transition's Gaussian KL (Flow-GRPO's divided by -dt)
    clip_low: float | None = None  # asymmetric clip: r in [1 - clip_low, 1 + clip_high]; None = clip_range
    clip_high: float | None = None
    guidance: float | None = None  # guidance-embedding scale (FLUX.1-dev): the sampling one; None = cfg_scale
    filter_zero_advantage: bool = False
    detach_uncond: bool = False  # no gradient through the unconditional CFG branch
    integer_timesteps: bool = False  # the model sees int(sigma * 1000) / 1000 (DanceGRPO)
    adv_weights: tuple[float, ...] | None = None  # per-reward advantages [N, K]: their weights w_k
    reward_aggregation: str = "losses"  # [N, K]: sum_k w_k L(A_k) (DanceGRPO) | L(clamp(sum_k w_k A_k)) (MixGRPO)
    guard_bias: str = "batch"  # grpo_guard: RatioNorm's bias per (forward, trained timestep) | per cell (algo.guard)
    algorithm: str = "flow_grpo"  # grpo_guard: RatioNorm + reweight (algo.guard); nft: algo.nft; else the above
    adv_clip_max: float = 5.0  # nft: c of the optimality r = clamp(A / c / 2 + 1/2, 0, 1) and of its loss
    nft_beta: float = 1.0  # nft: DiffusionNFT's beta (config/nft.py); it cancels in the gradient when old = current
    old_logprob: str = "generator"  # "recompute": logp_old = the trainer's under the step's start (train.old_logprob)
    tis_cap: float | None = None  # recompute: the policy term x min(exp(logp_start - logp_gen), cap) (verl's TIS)

    @property
    def clip_bounds(self) -> tuple[float, float]:
        """(eps_low, eps_high): the ratio's clip band is [1 - eps_low, 1 + eps_high]."""
        return (self.clip_range if self.clip_low is None else self.clip_low,
                self.clip_range if self.clip_high is None else self.clip_high)


@dataclass
class CellStats:
    """Sums over cells (divide by ``trained`` for means; ``cells`` also counts filtered ones); the ``mismatch_*``
    fields over the cells the generator-trainer mismatch was measured on (``train.old_logprob``: sums, and the
    largest |logp_gen - logp_start|)."""

    cells: int = 0
    loss: float = 0.0
    approx_kl: float = 0.0
    clipfrac: float = 0.0
    kl: float = 0.0
    clipfrac_gt_one: float = 0.0
    clipfrac_lt_one: float = 0.0
    trained: int = 0
    mismatch_cells: int = 0
    mismatch_sq: float = 0.0  # sum of 0.5 d^2
    mismatch_max: float = 0.0  # max |d| (combined by max, not summed)
    mismatch_clipped: float = 0.0

    def add(self, other: "CellStats") -> "CellStats":
        return CellStats(**{f.name: (max if f.name == "mismatch_max" else operator.add)(getattr(self, f.name),
                                                                                       getattr(other, f.name))
                            for f in fields(self)})

    def with_mismatch(self, m: Mismatch) -> "CellStats":
        return self.add(CellStats(mismatch_cells=m.cells, mismatch_sq=m.sq, mismatch_max=m.max_abs,
                                  mismatch_clipped=m.clipped))

    def means(self) -> dict[str, float]:
        n = max(self.trained, 1)
        keys = ("loss", "approx_kl", "clipfrac", "kl", "clipfrac_gt_one", "clipfrac_lt_one")
        out = {k: getattr(self, k) / n for k in keys}
        m = max(self.mismatch_cells, 1)
        out.update({"mismatch/approx_kl": self.mismatch_sq / m, "mismatch/max_abs_logp": self.mismatch_max,
                    "mismatch/clipfrac": self.mismatch_clipped / m, "mismatch/cells": self.mismatch_cells})
        return out


def train_cells(
    policy: Policy,
    group: TrajectoryBatch,
    cells: Sequence[tuple[int, int]],
    *,
    settings: LossSettings,
    loss_scale: float,
    ref_policy: Policy | None = None,
    collective: bool = False,
    step_start: bool = True,
) -> CellStats:
    """Accumulate the gradient of ``loss_scale * sum L_cell`` for ``cells`` = (generation, trained position).
    ``collective``: the forward is a collective of the pool's ranks (FSDP), so it runs even when every cell
    is filtered (first cell, weight 0: see the module docstring). ``step_start``: the policy holds the step's
    starting weights (the step's first round; ``train.old_logprob``)."""
    if group.advantages is None:
        raise ValueError("cannot train a group before its advantages are computed (invariant I3)")
    n_all, weight = len(cells), 1.0
    rows, tpos = cell_rows(group, cells)
    if settings.filter_zero_advantage:
        keep = nonzero(group.advantages[rows])
        kept, weight = kept_cells(range(n_all), keep.tolist(), collective)  # none left: [] or a throw-away cell
        if not kept:
            return CellStats(cells=n_all)
        rows, tpos = rows[kept], tpos[kept]
    if settings.algorithm == "nft":
        return _train_nft(policy, group, rows, tpos, n_all, weight, settings, loss_scale, ref_policy)
    guard = settings.algorithm == "grpo_guard"
    if guard and group.means is None:
        raise ValueError("train.algorithm=grpo_guard needs the behaviour means of the trained transitions "
                         "(the sampler records them when the run's algorithm is grpo_guard)")
    f = cell_forward(policy, group, rows, tpos, settings=settings, ref_policy=ref_policy, step_start=step_start)
    out, adv = f.out, group.advantages[rows].to(f.out.log_prob.device)
    if guard:  # GRPO-Guard (algo.guard): the ratio normalised with the behaviour mean the sampler recorded, the
        # bias averaged over the forward's cells of each trained timestep (train.guard_bias=batch, flow_grpo's
        # per-device batch) or per cell, the policy term divided by -dt, the KL term unchanged, no TIS weight
        old_mean = group.means[rows, tpos].to(out.mean.device)
        units = tpos.to(out.mean.device) if settings.guard_bias == "batch" else None
        loss, stats = _reward_terms(adv, settings, lambda a: guard_policy_loss(
            out.log_prob, f.old_logp, out.mean, old_mean, out.std, f.dt, a, settings.clip_range,
            clip_low=settings.clip_low, clip_high=settings.clip_high, units=units))
    else:
        loss, stats = _reward_terms(adv, settings, lambda a: clipped_policy_loss(
            out.log_prob, f.old_logp, a, settings.clip_range, clip_low=settings.clip_low, clip_high=settings.clip_high))
        if f.tis is not None:
            loss = loss * f.tis
    ratio_stats = {k: float(getattr(stats, k)) for k in ("approx_kl", "clipfrac", "clipfrac_gt_one", "clipfrac_lt_one")}
    res = _backward(loss, f.kl, settings, loss_scale, weight, n_all, len(rows), ratio_stats)
    return res.with_mismatch(f.mismatch) if weight else res


def cell_rows(group: TrajectoryBatch, cells: Sequence[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows of ``group``, trained positions) of ``cells`` = (generation, trained position)."""
    row_of = {int(g): r for r, g in enumerate(group.gen_index.tolist())}
    try:
        rows = torch.tensor([row_of[g] for g, _ in cells], dtype=torch.long)
    except KeyError as e:
        raise ValueError(f"cell generation {e} is not in this group") from None
    return rows, torch.tensor([t for _, t in cells], dtype=torch.long)


def _reward_terms(adv: torch.Tensor, settings: LossSettings, term):
    """(loss per cell, statistics) of ``term(advantages)``: one term, or with per-reward advantages [N, K]
    (``train.adv_per_reward``) by ``settings.reward_aggregation``: ``losses`` (DanceGRPO's vq / mq) each reward's
    own term weighted, sum_k w_k term(A_k), with the first reward's statistics; ``advantages`` (MixGRPO's
    ``advantage_aggr``) one term of the clamped weighted advantage, term(clamp(sum_k w_k A_k, -c, c)), c =
    ``adv_clip_max`` (the A_k come unclipped: ``step_math.assign_advantages``). The two agree while every ratio
    is inside the clip interval (on-policy) and differ where one leaves it."""
    if adv.ndim == 1:
        return term(adv)
    if settings.adv_weights is None or len(settings.adv_weights) != adv.shape[1]:
        raise ValueError(f"{adv.shape[1]} advantage columns need as many reward weights, got {settings.adv_weights}")
    if settings.reward_aggregation == "advantages":
        w = torch.tensor(settings.adv_weights, dtype=adv.dtype, device=adv.device)
        return term((adv * w).sum(1).clamp(-settings.adv_clip_max, settings.adv_clip_max))
    terms = [term(adv[:, k]) for k in range(adv.shape[1])]
    return sum(w * t for w, (t, _) in zip(settings.adv_weights, terms)), terms[0][1]


def _backward(loss: torch.Tensor, kl: torch.Tensor, settings: LossSettings, loss_scale: float, weight: float,
              n_all: int, n: int, means: dict[str, float]) -> CellStats:
    """``backward(weight * loss_scale * sum(loss + beta_kl KL))`` of the n trained cells and their statistics (sums;
    ``means`` are per-cell means); a throw-away collective cell (weight 0) counts only in ``cells``."""
    total = loss + settings.beta_kl * kl
    (total.sum() * (loss_scale * weight)).backward()
    if weight == 0.0:
        return CellStats(cells=n_all)
    return CellStats(cells=n_all, loss=float(total.detach().sum()), kl=float(kl.detach().sum()), trained=n,
                     **{k: v * n for k, v in means.items()})


@dataclass
class CellForward:
    """What the one packed forward of a chunk's cells gives every cell loss: the SDE step output under the
    policy (``log_prob`` with gradient), logp_old (``train.old_logprob``), the KL to the reference (0 when
    beta_kl = 0), dt, the detached TIS weight (None when ``train.tis_cap`` is off) and the mismatch sums."""

    out: object
    old_logp: torch.Tensor
    kl: torch.Tensor
    dt: torch.Tensor
    tis: torch.Tensor | None
    mismatch: Mismatch


def cell_forward(policy: Policy, group: TrajectoryBatch, rows: torch.Tensor, tpos: torch.Tensor, *,
                 settings: LossSettings, ref_policy: Policy | None = None, step_start: bool = True) -> CellForward:
    """The ``CellForward`` of the cells (``rows`` of ``group``, trained positions ``tpos``): one forward of the
    packed batch (plus, under ``recompute`` outside the step's first round, one no-grad forward with the
    step-start weights). Shared by ``train_cells``, GRPO-Guard and the deferred heads of ``train.loss_scale``."""
    device = next(policy.parameters()).device
    x = group.latents[rows, tpos].to(device)
    x_next = group.next_latents[rows, tpos].to(device)
    logp_gen = group.log_probs[rows, tpos].to(device)
    step_idx = group.trained_steps[tpos]
    sigma = group.sigmas[step_idx].to(device)
    sigma_next = group.sigmas[step_idx + 1].to(device)
    cond = policy.encode_prompts([group.prompts[r] for r in rows.tolist()])
    recompute = settings.old_logprob == "recompute"
    start = None
    if recompute and not step_start:  # first, so that the training graph never sees the swapped weights
        start = _step_start_logprob(policy, group, x, sigma, sigma_next, cond, x_next, settings)
    out = _sde_step(policy, x, sigma, sigma_next, cond, x_next, settings, detach_uncond=settings.detach_uncond)
    kl = _kl(out, ref_policy, x, sigma, sigma_next, cond, x_next, settings)
    measured = Mismatch()
    if step_start:  # the trainer holds the behaviour version of the on-policy samples: logp_start for free
        start = out.log_prob.detach()
        fresh = (group.version[rows] == group.step[rows]).to(device)
        measured = mismatch(logp_gen, start, fresh, *settings.clip_bounds)
    tis = tis_weight(start, logp_gen, settings.tis_cap) if recompute and settings.tis_cap is not None else None
    return CellForward(out, start if recompute else logp_gen, kl, (sigma_next - sigma).to(out.log_prob.dtype),
                       tis, measured)


def _step_start_logprob(policy: Policy, group: TrajectoryBatch, x, sigma, sigma_next, cond, x_next,
                        settings: LossSettings) -> torch.Tensor:
    """logp_start of the cells in a later round: a no-grad forward with the step-start snapshot swapped in."""
    snap = step_start_of(policy)
    if snap is None:
        raise RuntimeError("train.old_logprob=recompute: a later round of the step needs the step-start snapshot "
                           "of the weights (train.old_logprob.attach)")
    snap.check(int(group.step[0]))
    with snap.swapped():
        return _no_grad_step(policy, x, sigma, sigma_next, cond, x_next, settings).log_prob


def _sde_step(policy: Policy, x, sigma, sigma_next, cond, x_next, settings: LossSettings, detach_uncond=False):
    """The SDE step output of the recorded transitions under ``policy`` (``_no_grad_step``: without gradient)."""
    v = guided_velocity(policy, x, sigma, cond, settings.cfg_scale, guidance=settings.guidance,
                        detach_uncond=detach_uncond, integer_timesteps=settings.integer_timesteps)
    return sde_step_with_logprob(x, v, sigma, sigma_next, noise_level=settings.noise_level, kind=settings.kind,
                                 prev_sample=x_next)


_no_grad_step = torch.no_grad()(_sde_step)


def _kl(out, ref_policy: Policy | None, x, sigma, sigma_next, cond, x_next, settings: LossSettings) -> torch.Tensor:
    """KL of the cells' transitions to the reference policy's (``algo.loss.reference_kl``); 0 when beta = 0."""
    if settings.beta_kl <= 0:
        return torch.zeros_like(out.log_prob)
    if ref_policy is None:
        raise ValueError("train.beta_kl > 0 needs a reference policy")
    return reference_kl(out, _no_grad_step(ref_policy, x, sigma, sigma_next, cond, x_next, settings).mean,
                        settings.kl_form)


def nft_cell_inputs(group: TrajectoryBatch, rows: torch.Tensor, tpos: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x0, t, eps) of DiffusionNFT cells (``rows`` of ``group``, training slots ``tpos``): the clean samples and
    each cell's draw from its trajectory seed (``algo.nft``: a point of the T-point sampling schedule, fresh
    noise), so a cell computes the same whatever chunk, rank or mode trains it (I1)."""
    x0 = group.final[rows]
    T = len(group.sigmas) - 1
    seeds, slots = group.seed[rows].tolist(), tpos.tolist()
    idx = torch.tensor([nft.slot_timestep_index(s, j, T) for s, j in zip(seeds, slots)], dtype=torch.long)
    eps = torch.stack([nft.slot_noise(s, j, tuple(x0.shape[1:])) for s, j in zip(seeds, slots)])
    return x0, group.sigmas[idx], eps


def _nft_forward(policy: Policy, group: TrajectoryBatch, rows: torch.Tensor, tpos: torch.Tensor,
                 settings: LossSettings, ref_policy: Policy | None):
    """(v, v_old, x_t, x0, t, KL) of DiffusionNFT cells: one CFG-free forward on the freshly noised clean
    samples; v_old from a no-grad forward with the old copy swapped in (``train.nft_old_policy=soft``, first, so
    the graph of v never sees swapped weights) or v detached (``current``); the KL to the reference a velocity
    MSE (0 when beta_kl = 0)."""
    device = next(policy.parameters()).device
    x0, sigma, eps = nft_cell_inputs(group, rows, tpos)
    x0, sigma = x0.to(device), sigma.to(device)
    x_t, x0_dtype = nft.forward_noise(x0, eps.to(device), sigma), x0.dtype
    cond = policy.encode_prompts([group.prompts[r] for r in rows.tolist()])
    kw = dict(guidance=settings.guidance, integer_timesteps=settings.integer_timesteps)
    old = old_of(policy)
    v_old = None
    if old is not None:
        with torch.no_grad(), old.swapped():
            v_old = guided_velocity(policy, x_t, sigma, cond, 1.0, **kw)
    v = guided_velocity(policy, x_t, sigma, cond, 1.0, **kw)
    f32 = torch.float32 if v.dtype in (torch.float16, torch.bfloat16) else v.dtype  # the loss in float32 (autocast)
    v, x_t, x0 = v.to(f32), x_t.to(f32), x0.to(f32)
    v_old = v.detach() if v_old is None else v_old.to(f32)
    kl = torch.zeros(len(rows), dtype=v.dtype, device=v.device)
    if settings.beta_kl > 0:
        if ref_policy is None:
            raise ValueError("train.beta_kl > 0 needs a reference policy")
        with torch.no_grad():
            v_ref = guided_velocity(ref_policy, x_t.to(x0_dtype), sigma, cond, 1.0, **kw)
        kl = nft.velocity_kl(v, v_ref.to(f32))
    return v, v_old, x_t, x0, sigma, kl


def nft_cell_terms(policy: Policy, group: TrajectoryBatch, rows: torch.Tensor, tpos: torch.Tensor, *,
                   settings: LossSettings, ref_policy: Policy | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(l, m, KL) of DiffusionNFT cells with L_cell = A l + m (``algo.nft.linear_parts``; m includes
    beta_kl KL): the form the deferred heads of ``train.loss_scale`` train before the advantages are known."""
    v, v_old, x_t, x0, sigma, kl = _nft_forward(policy, group, rows, tpos, settings, ref_policy)
    pos, neg = nft.nft_parts(v, v_old, x_t, x0, sigma, beta=settings.nft_beta)
    ell, m = nft.linear_parts(pos, neg, beta=settings.nft_beta, adv_clip_max=settings.adv_clip_max)
    return ell, m + settings.beta_kl * kl, kl


def _train_nft(policy: Policy, group: TrajectoryBatch, rows: torch.Tensor, tpos: torch.Tensor, n_all: int,
               weight: float, settings: LossSettings, loss_scale: float, ref_policy: Policy | None) -> CellStats:
    """``train_cells`` with DiffusionNFT's loss (``algo.nft``): v_old from the old copy (``soft``, a second
    no-grad forward) or the forward's detached velocity (``current``: no second forward)."""
    v, v_old, x_t, x0, sigma, kl = _nft_forward(policy, group, rows, tpos, settings, ref_policy)
    r = nft.optimality(group.advantages[rows].to(v.device), settings.adv_clip_max)
    loss, st = nft.nft_loss(v, v_old, x_t, x0, sigma, r, beta=settings.nft_beta,
                            adv_clip_max=settings.adv_clip_max)
    return _backward(loss, kl, settings, loss_scale, weight, n_all, len(rows), {"approx_kl": float(st.old_deviate)})
