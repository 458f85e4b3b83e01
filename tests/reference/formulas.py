"""The formulas of one step, written from the papers and the peers' scripts for the I1 reference (``loop.py``).

Nothing here imports digenrl's training math (``train.step_math``, ``train.loss_scale``, ``train.chunk_loss``,
``train.sample_masks``, ``algo.advantage``, ``algo.loss``, ``algo.sde``, ``algo.guard``, ``algo.nft``): each rule
is read off its source and written again, plainly, per group or per sample. The seeds of the seeded draws
(Flow-GRPO's refill and sample minibatches, DiffusionNFT's slot draws) are the product's documented ones: a
different seed would be another, equally valid run, not another rule.

Sources: yifan123/flow_grpo ``scripts/train_sd3.py`` (advantages, zero-advantage filter and refill, minibatches,
clipped loss, KL), ``flow_grpo/diffusers_patch/sd3_sde_with_logprob.py`` (SDE step, log-prob); XueZeyue/DanceGRPO
``train_grpo_flux.py`` / ``train_grpo_hunyuan.py`` (the eta-SDE, best-of-n); MixGRPO's
``fastvideo/train_grpo_flux.py`` (``advantage_aggr``, its minibatches of generations); GRPO-Guard (arXiv
2510.22319: RatioNorm, the 1/(-dt) reweight; flow_grpo's ``scripts/train_sd3_GRPO_Guard.py``: the bias's batch
mean); NVlabs/DiffusionNFT ``scripts/train_nft_sd3.py`` (the forward-process loss, the adaptive weights, the soft
old policy, ``return_decay``); Flow-GRPO's ``ema.py`` (the EMA's warm-up decay).
"""

from __future__ import annotations

import math

import torch

from digenrl.rollout import noise


# ---- advantages (Flow-GRPO stat tracking, DanceGRPO) ---------------------------------------------------------
def advantages(rewards: list[list[float]], t, clip: bool = True) -> list[torch.Tensor]:
    """Per group (in group order) A = clip((r - b) / (s + eps), +-c): b the group's or the step's mean, s the
    group's or the step's std (numpy's population std, or torch's unbiased one), float64 then float32; ``clip``
    False: not clipped (MixGRPO clamps the weighted sum of the per-reward advantages instead)."""
    allr = torch.tensor([x for g in rewards for x in g], dtype=torch.float64)
    out = []
    for g in rewards:
        r = torch.tensor(g, dtype=torch.float64)
        base = r.mean() if t.adv_baseline == "group" else allr.mean()
        s = (r if t.std_mode == "group" else allr).std(unbiased=t.adv_std_unbiased)
        a = (r - base) / (s + t.adv_eps)
        out.append((a.clamp(-t.adv_clip_max, t.adv_clip_max) if clip else a).float())
    return out


def reward_aggregation(t) -> str:
    """How per-reward advantages enter the loss: the key, else the algorithm's reference (MixGRPO's
    ``advantage_aggr`` for mixgrpo: "advantages"; DanceGRPO's per-reward losses otherwise: "losses")."""
    if t.reward_aggregation is not None:
        return t.reward_aggregation
    return "advantages" if t.algorithm == "mixgrpo" else "losses"


def per_reward_advantages(parts: dict[str, list[list[float]]], t) -> list[torch.Tensor]:
    """Multi-reward advantages: one column per reward part, each normalised alone, [G, K] per group; each column
    clipped to +-c (DanceGRPO), or not where they are aggregated before the loss (MixGRPO ``advantage_aggr``:
    ``aggregated_advantage``)."""
    clip = reward_aggregation(t) == "losses"
    cols = [advantages(groups, t, clip=clip) for groups in parts.values()]
    return [torch.stack([c[i] for c in cols], dim=1) for i in range(len(cols[0]))]


def aggregated_advantage(a: torch.Tensor, weights: list[float], c: float) -> torch.Tensor:
    """MixGRPO's ``advantage_aggr`` (``fastvideo/train_grpo_flux.py``): A = clamp(sum_k w_k A_k, -c, c), per
    sample, from the unclipped per-reward advantages [N, K]."""
    total = sum(w * a[:, k] for k, w in enumerate(weights))
    return total.clamp(-c, c)


def nonzero(a: torch.Tensor) -> torch.Tensor:
    return a != 0 if a.ndim == 1 else (a != 0).any(1)


# ---- which samples train (DanceGRPO best-of-n, Flow-GRPO's filter, refill, sample minibatches) ----------------
def best_of_n(rewards: list[float], n: int, t, parts: dict[str, list[float]] | None = None,
              weights: dict[str, float] | None = None) -> list[int]:
    """The rows DanceGRPO's ``--bestofn`` keeps: argsort of the unclipped group-normalised score (sum_k w_k A_k of
    the parts with per-reward advantages), the n/2 lowest and the n/2 highest, ties to the lower index."""
    def z(v):
        r = torch.tensor(v, dtype=torch.float64)
        return (r - r.mean()) / (r.std(unbiased=t.adv_std_unbiased) + t.adv_eps)

    score = z(rewards) if weights is None else sum(w * z(parts[k]) for k, w in weights.items())
    order = torch.argsort(score, stable=True).tolist()
    return sorted(order[: n // 2] + order[-(n // 2):])


def refill(adv: list[torch.Tensor], micro_batches: int, seed: int, step: int) -> list[torch.Tensor]:
    """Flow-GRPO's refill: kept = A != 0; while kept does not fill ``micro_batches`` equal micro-batches, re-add
    the first (-kept mod R) of a seeded permutation of the zero-advantage samples (group by group, row order)."""
    keep = [nonzero(a).clone() for a in adv]
    short = -sum(int(k.sum()) for k in keep) % micro_batches
    zeros = [(i, j) for i, k in enumerate(keep) for j in range(len(k)) if not k[j]]
    if short and len(zeros) >= short:
        gen = torch.Generator().manual_seed(noise.stable_seed(seed, step, "zero_adv_refill"))
        for r in torch.randperm(len(zeros), generator=gen)[:short].tolist():
            keep[zeros[r][0]][zeros[r][1]] = True
    return keep


def sample_minibatches(kept: list[list[int]], minibatches: int, seed: int, step: int, epoch: int) -> list[set]:
    """Flow-GRPO's ``samples[randperm].reshape(num_batches, ...)``: the kept (group, row) pairs listed group by
    group, permuted with the seeded permutation, cut into M near-equal contiguous parts."""
    flat = [(g, j) for g, rows in enumerate(kept) for j in rows]
    gen = torch.Generator().manual_seed(noise.stable_seed(seed, step, epoch, "minibatch_split"))
    perm = torch.randperm(len(flat), generator=gen)
    return [{flat[i] for i in part.tolist()} for part in torch.tensor_split(perm, minibatches)]


def group_minibatches(prompts: int, minibatches: int) -> list[range]:
    """Flow-GRPO's two optimizer steps per batch, by group index: block m = groups ceil(m P / M) .. ceil((m+1) P / M)."""
    b = [-(-m * prompts // minibatches) for m in range(minibatches + 1)]
    return [range(b[m], b[m + 1]) for m in range(minibatches)]


def generation_minibatches(generations: int, minibatches: int) -> list[range]:
    """MixGRPO's optimizer steps (one prompt per GPU, 12 generations, ``optimizer.step()`` every 3 samples): step m
    takes the generations ceil(m G / M) .. ceil((m + 1) G / M) - 1 of every prompt."""
    b = [-(-m * generations // minibatches) for m in range(minibatches + 1)]
    return [range(b[m], b[m + 1]) for m in range(minibatches)]


# ---- the SDE transition and its log-probability (Flow-GRPO, DanceGRPO, CPS) ------------------------------------
def sde_step(x, v, sigma, sigma_next, kind: str, a: float):
    """(mean, transition std, std_dev_t, log p(. | x) as a function of x') of one step x -> x' (sigma: [B])."""
    s = sigma.reshape(-1, *([1] * (x.ndim - 1))).to(x.dtype)
    sn = sigma_next.reshape(-1, *([1] * (x.ndim - 1))).to(x.dtype)
    dt = sn - s
    if kind == "cps":  # coefficients-preserving sampling; its log-prob is Flow-GRPO's constant-free surrogate
        std = sn * math.sin(a * math.pi / 2)
        mean = (1 - sn) * (x - s * v) + torch.sqrt((sn ** 2 - std ** 2).clamp_min(0)) * (x + (1 - s) * v)
        return mean, std, std, lambda xn: (-(xn - mean) ** 2).mean(dim=tuple(range(1, x.ndim)))
    if kind == "flow_grpo":
        s_t = a * torch.sqrt(s / (1 - torch.where(s >= 1, sn, s)))
    else:  # dance: constant eta
        s_t = torch.full_like(s, a)
    mean = x * (1 + s_t ** 2 / (2 * s) * dt) + v * (1 + s_t ** 2 * (1 - s) / (2 * s)) * dt
    std = s_t * torch.sqrt(-dt)

    def logp(xn):
        lp = -((xn - mean) ** 2) / (2 * std ** 2) - torch.log(std) - 0.5 * math.log(2 * math.pi)
        return lp.mean(dim=tuple(range(1, x.ndim)))

    return mean, std, s_t, logp


def clipped(log_ratio, adv, low: float, high: float):
    """PPO's clipped objective per sample: max(-A r, -A clip(r, 1 - low, 1 + high)), r = exp(log_ratio)."""
    r = torch.exp(log_ratio)
    return torch.maximum(-adv * r, -adv * r.clamp(1 - low, 1 + high))


def guard_bias(mean, old_mean, std, units: list | None = None):
    """GRPO-Guard's RatioNorm bias per sample, mean((mu_theta - mu_old)^2) / (2 sigma^2) (sigma: the transition
    std, [B]); ``units`` (one label per sample) None: each sample's own (the paper's formula); else flow_grpo's
    ``(mean - old_mean).pow(2).mean(dim=tuple(range(1, log_prob.ndim)))`` on a 1-D ``log_prob``, an empty tuple of
    dims that torch reads as every dim: one bias for the samples forwarded together at one timestep, each sample
    getting the mean over the samples of its label."""
    own = ((mean - old_mean) ** 2).mean(dim=tuple(range(1, mean.ndim))) / (2 * std ** 2)
    if units is None:
        return own
    out = torch.empty_like(own)
    for u in set(units):
        idx = torch.tensor([i for i, v in enumerate(units) if v == u])
        out[idx] = own[idx].mean()
    return out


def kl(mean, ref_mean, scale):
    """mean((mean - ref_mean)^2) / (2 scale^2) per sample (Flow-GRPO: scale = std_dev_t; exact: the transition std)."""
    return ((mean - ref_mean) ** 2 / (2 * scale ** 2)).mean(dim=tuple(range(1, mean.ndim)))


# ---- DiffusionNFT ----------------------------------------------------------------------------------------------
def nft_slot(seed: int, slot: int, points: int, shape) -> tuple[int, torch.Tensor]:
    """(schedule index, noise) of training slot ``slot`` of a sample: slot j of a seeded permutation of the T
    schedule points, and fresh noise, both from the trajectory's seed."""
    g = torch.Generator().manual_seed(noise.stable_seed(int(seed), "nft_t"))
    idx = int(torch.randperm(points, generator=g)[slot])
    g = torch.Generator().manual_seed(noise.stable_seed(int(seed), "nft_eps", int(slot)))
    return idx, torch.randn(tuple(shape), generator=g)


def nft_loss(v, v_old, x_t, x0, t, adv, c: float, beta: float):
    """c (r L+ + (1 - r) L-) / beta per sample: r = clamp(A / c / 2 + 1/2, 0, 1), v+- the implicit policies, L+-
    their x0 errors over a detached adaptive weight max(mean|x0_hat - x0|, 1e-5)."""
    tt = t.reshape(-1, *([1] * (x0.ndim - 1)))
    v_old = v_old.detach()
    dims = tuple(range(1, x0.ndim))

    def err(vv):
        x0_hat = x_t - tt * vv
        w = (x0_hat.detach().double() - x0.double()).abs().mean(dim=dims, keepdim=True).clamp_min(1e-5)
        return ((x0_hat - x0) ** 2 / w.to(x0_hat.dtype)).mean(dim=dims)

    r = (adv / c / 2 + 0.5).clamp(0, 1)
    pos, neg = err(beta * v + (1 - beta) * v_old), err((1 + beta) * v_old - beta * v)
    return c * (r * pos + (1 - r) * neg) / beta


def old_decay(n: int, flat: int, rate: float, cap: float) -> float:
    """DiffusionNFT's ``return_decay``: 0 before ``flat`` optimizer steps, then min(rate (n - flat), cap)."""
    return 0.0 if n < flat else min((n - flat) * rate, cap)


def ema_decay(n: int, decay: float, warmup: bool) -> float:
    """Flow-GRPO's EMA decay after optimizer step n: min((1 + n) / (10 + n), decay) with its warm-up."""
    return min((1 + n) / (10 + n), decay) if warmup else decay
