"""Step-wide advantage statistics in a pipelined trainer: train provisionally, rescale at the commit, correct.

With ``std_mode="global"`` (Flow-GRPO ``sample.global_std``) or ``adv_baseline="batch"`` (Flow-GRPO
``per_prompt_stat_tracking=False``) an advantage needs every reward of the step, but a pipelined trainer
trains a group as soon as its own rewards are in. This module is the math that makes that exact.

Notation. Group g: rewards r_i, mean m_g, std s_g. Step (all its B rewards): mean m_B, std s_B::

    A_i = clip(Ã_i, -c, c),     Ã_i = Λ w_g (r_i - b_i)
    std_mode=group:   w_g = 1 / (s_g + eps),  Λ = 1        std_mode=global:  w_g = 1,  Λ = 1 / (s_B + eps)
    baseline=group:   b_i = m_g                             baseline=batch:   b_i = m_B

Per cell (ratio ρ = exp(logp - logp_old)), with σ(x) = +1 if x >= 0 else -1::

    max(-A ρ, -A clip(ρ)) = A ℓ^σ(A)(ρ),    ℓ^+(ρ) = -min(ρ, clip ρ),   ℓ^-(ρ) = -max(ρ, clip ρ)

so on a fixed branch σ the loss is linear in A (positively homogeneous in A: this is why a scale can wait),
and the two branches agree wherever ρ lies inside the clip interval [1 - eps_low, 1 + eps_high].

Provisional terms (``provisional_terms``: what is known once group g is complete). ``b0`` is one number per
trainer rank and round: the mean of the step's rewards known when the round starts there (0 and unused with
the group baseline). Then, with the coefficients p_i, q_i and the branch σ_i::

    baseline=group:  p_i = w_g (r_i - m_g),  q_i = 0,    σ_i = σ(p_i) = σ(A_i)
    baseline=batch:  p_i = w_g (r_i - b0),   q_i = w_g,  σ_i = σ(r_i - b0)

    Ã_i = Λ p_i + Λ (b0 - m_B) q_i                                            (``implied``)

The trainer keeps separate gradient accumulators ("heads", each with the cell scale 1/S)::

    H_p = grad sum_cells κ_i p_i ℓ^σ_i(ρ),   H_q = grad sum_cells κ_i q_i ℓ^σ_i(ρ),   H_kl = grad sum_cells κ_i KL

where κ_i says whether sample i is trained provisionally: with ``filter_zero_advantage`` and the group
baseline, κ_i = (p_i != 0) (A_i = 0 exactly when p_i = 0, at any scale); κ_i = 0 in a ``late`` group (below);
else κ_i = 1 (with the batch baseline a sample that ties its group mean is zero only if it ties the step's
mean, known at the end). The commit (``head_coefficients``), once every reward is in, forms::

    grad = (1 / kept) [ Λ H_p + Λ (b0 - m_B) H_q + β H_kl + C ]
    C    = grad sum_{cells of corrected samples} [ A_i ℓ^σ(A_i)(ρ) - κ_i Ã_i ℓ^σ_i(ρ) + β (k_i - κ_i) KL ]

with k_i = (A_i != 0) under the filter (else 1) and kept = sum of k_i over the round's groups. This equals the
reference (1 / kept) grad sum_{k_i = 1} [A_i ℓ^σ(A_i)(ρ) + β KL] term by term: a sample with κ_i = k_i = 1 gets
Ã_i ℓ^σ_i + β KL from the heads and turns it into A_i ℓ^σ(A_i) + β KL with C; one with κ_i = 1, k_i = 0 (its
reward equals m_B) is removed by C (A_i = 0); one with κ_i = 0, k_i = 1 (late) is trained by C alone; one
with κ_i = k_i = 0 is in neither. The correction term of a cell is zero unless (``corrections``)

* the clip acts at the final scale (A_i != Ã_i): every cell of the sample, coefficient A_i - Ã_i on its branch;
* k_i != κ_i: every cell of the sample;
* the branch changed (σ(A_i) != σ_i, batch baseline only) and the cell's ratio left the clip interval.

When Λ = 1 (``std_mode=group``) H_p and H_kl have known coefficients and share one accumulator; with the group
baseline there is no H_q. The zero-advantage filter and ``kept`` always use the final A_i.

Rounding: the heads hold Ã_i implicitly, as Λ p_i + Λ (b0 - m_B) q_i, in the trainer's float32. With
``std_mode=group`` and the batch baseline a group whose rewards (nearly) tie has a huge w_g = 1 / (s_g + eps)
(1e4 for a tie with eps 1e-4), so p_i and q_i (b0 - m_B) are huge and cancel to an A_i that is 0 or clipped:
float32 would lose its digits. Such a group (``late``: w_g times the spread of the rewards known so far above
``LATE`` x c) is not trained provisionally (κ_i = 0) but entirely in the correction pass, with its final
advantages (held Ã_i = 0, so its cells get A_i ℓ^σ(A_i) + β k_i KL). Elsewhere the coefficients stay within a
few c of the final advantages and the result equals the reference to float32 rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AdvOptions:
    """The advantage options (``train.std_mode``, ``adv_baseline``, ``adv_eps``, ``adv_clip_max``,
    ``adv_std_unbiased``, ``filter_zero_advantage``, ``adv_per_reward``; ``clip_parts``: each per-reward column
    clipped, not their weighted sum in the loss, ``train.reward_aggregation=losses``), read from a
    ``TrainConfig`` by ``train.step_math.adv_options``."""

    std_mode: str = "group"
    baseline: str = "group"
    eps: float = 1e-4
    clip: float = 5.0
    unbiased: bool = False
    filter_zero: bool = True
    per_reward: bool = False
    clip_parts: bool = True



def sign(x: torch.Tensor) -> torch.Tensor:
    """σ(x) = +1 where x >= 0, else -1 (float64)."""
    return torch.where(x >= 0, 1.0, -1.0).to(torch.float64)


def _std(r: torch.Tensor, unbiased: bool) -> float:
    return float(r.std(unbiased=unbiased)) if len(r) > 1 else 0.0


LATE = 64.0  # a group whose provisional coefficients would exceed LATE x adv_clip_max is trained at the commit


@dataclass(frozen=True)
class GroupTerms:
    """One group's provisional terms (module docstring): p_i, q_i (None: group baseline), σ_i and κ_i
    (``keep``: trained provisionally); ``late``: the whole group is trained in the correction pass."""

    p: torch.Tensor       # [G] float64
    q: torch.Tensor | None
    sign: torch.Tensor    # [G] float64, +-1
    keep: torch.Tensor    # [G] bool
    late: bool = False


def provisional_terms(rewards: torch.Tensor, opts: AdvOptions, b0: float = 0.0, spread: float = 0.0) -> GroupTerms:
    """The terms of a complete group (``rewards`` [G], in generation order) before the step's statistics;
    ``b0``: the provisional baseline, ``spread``: max - min of the step's rewards known so far (this group's
    included), the scale of b0 - m_B."""
    r = rewards.to(torch.float64)
    w = 1.0 / (_std(r, opts.unbiased) + opts.eps) if opts.std_mode == "group" else 1.0
    if opts.baseline == "group":
        p = (r - r.mean()) * w
        keep = p != 0 if opts.filter_zero else torch.ones(len(r), dtype=torch.bool)
        return GroupTerms(p, None, sign(p), keep)
    late = opts.std_mode == "group" and w * spread > LATE * opts.clip
    return GroupTerms((r - b0) * w, torch.full_like(r, w), sign(r - b0), torch.full((len(r),), not late), late)


def step_scale(all_rewards: torch.Tensor, opts: AdvOptions) -> tuple[float, float]:
    """(Λ, m_B) of the step's rewards (all B, in batch order), as ``algo.advantage.group_advantages`` takes them."""
    r = all_rewards.to(torch.float64)
    lam = 1.0 / (float(r.std(unbiased=opts.unbiased)) + opts.eps) if opts.std_mode == "global" else 1.0
    return lam, float(r.mean())


def head_coefficients(opts: AdvOptions, lam: float, mean: float, b0: float) -> dict[str, float]:
    """The commit's factors of the accumulators: {"p": Λ, "q": Λ (b0 - m_B)} (KL: 1, known when training)."""
    out = {"p": lam}
    if opts.baseline == "batch":
        out["q"] = lam * (b0 - mean)
    return out


def implied(terms: GroupTerms, coef: dict[str, float]) -> torch.Tensor:
    """Ã_i: the advantage the accumulators hold for each sample at the final scale (float64)."""
    a = terms.p * coef["p"]
    if terms.q is not None:
        a = a + terms.q * coef["q"]
    return a


@dataclass(frozen=True)
class Correction:
    """Per sample of a group: the correction pass's coefficients and which samples need one."""

    final: torch.Tensor      # A_i (float64 of the final float32 advantage)
    held: torch.Tensor       # Ã_i (0 where κ_i = 0)
    kl: torch.Tensor         # k_i - κ_i  (times β in the loss)
    whole: torch.Tensor      # bool: every cell of the sample is corrected (clip acts, or k changed with β > 0)
    flipped: torch.Tensor    # bool: the branch changed (only cells whose ratio left the clip interval)


def corrections(terms: GroupTerms, final: torch.Tensor, unclipped: torch.Tensor, coef: dict[str, float],
                opts: AdvOptions) -> Correction:
    """``final``: the group's final advantages (``group_advantages``, float32); ``unclipped``: the same without
    the clip (``adv_clip_max = inf``): A_i != unclipped_i is where the clip acts."""
    a = final.to(torch.float64)
    k = a != 0 if opts.filter_zero else torch.ones(len(a), dtype=torch.bool)
    dk = k.to(torch.float64) - terms.keep.to(torch.float64)
    clipped = final != unclipped
    held = torch.where(terms.keep, implied(terms, coef), 0.0)  # a sample not trained provisionally holds nothing
    held = torch.where(clipped | (dk != 0), held, a)  # elsewhere equal up to rounding: no correction
    whole = clipped | (dk != 0)
    flipped = (sign(a) != terms.sign) & terms.keep & k
    return Correction(a, held, dk, whole, flipped)
