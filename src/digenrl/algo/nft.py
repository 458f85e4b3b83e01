"""DiffusionNFT (Zheng et al. 2025, "DiffusionNFT: Online Diffusion Reinforcement with Forward Process",
arXiv 2509.16117): negative-aware fine-tuning on the forward process. No log-probs, no SDE: the policy is
trained by flow matching on its own clean samples, pulled towards the good ones and pushed from the bad ones.

Convention (``algo.sde``): t = sigma, x_t = (1 - t) x0 + t eps, the model predicts v = eps - x0, so the data
prediction of a velocity is x0_hat(v) = x_t - t v.

Per cell (sample i with clean sample x0 and advantage A, training slot j)::

    r      = clamp(A / c / 2 + 1/2, 0, 1)                 optimality probability, c = train.adv_clip_max
    t, eps = the slot's draw (below);   x_t = (1 - t) x0 + t eps
    v      = v_theta(x_t, t, prompt)        v_old = v_old(x_t, t, prompt)      (no CFG: CFG-free training)
    v+     = beta v + (1 - beta) v_old      implicit positive velocity
    v-     = (1 + beta) v_old - beta v      implicit negative velocity
    w+-    = max(mean|x0_hat(v+-) - x0|, 1e-5)            adaptive weight, detached (float64)
    L+-    = mean((x0_hat(v+-) - x0)^2) / w+-
    L      = c (r L+ + (1 - r) L-) / beta  [+ beta_kl mean((v - v_ref)^2)]

(means over the latent's elements). ``beta`` is the reference's ``config.beta`` (1.0 in ``config/nft.py``
``_get_config``; 0.1 in its ``sd3_ocr`` and ``sd3_multi_reward`` recipes); the KL to the reference is a velocity
MSE with the reference's ``config.train.beta`` (1e-4 for SD3) as weight (here ``train.beta_kl``).

Why ``beta`` matters only with a separate old policy: with v_old = v (``train.nft_old_policy=current``) every
x0_hat is x0_hat(v), w+ = w- = w, and dL/dv = c (2r - 1) dE/dv = A dE/dv with E = mean((x0_hat(v) - x0)^2) / w
(beta and c cancel): advantage-weighted flow matching on fresh noise, with the per-sample weight 1 / w that
normalises the loss by the sample's own error. With the reference's soft old policy (``soft``, the default)
v_old != v once old has moved, and beta sets how far the implicit policies reach from it.

The draw of a slot (every mode and partition computes the same cells: invariant I1). The reference draws, per
sample and inner epoch, a random permutation of the T sampling timesteps (``pipeline.scheduler.timesteps``, the
schedule the sample was generated on) and trains the first K = ``int(T * timestep_fraction)`` of them (0.99:
9 of 10), each with fresh ``torch.randn_like`` noise. Here the permutation and the noise are seeded by the
trajectory's seed (itself ``stable_seed(run seed, step, prompt uid, generation)``, ``rollout.noise``)::

    perm_i = randperm(T, seed = stable_seed(seed_i, "nft_t"));  t_ij = sigmas[perm_i[j]]
    eps_ij = randn(latent shape, seed = stable_seed(seed_i, "nft_eps", j))

The same draw in every inner epoch (the reference redraws per inner epoch; its recipes run one).

The old policy (``train.nft_old_policy``, ``soft`` or ``current``): ``train.nft_old``. With TCSS staleness a
stale sample is data from an older sampler while old and theta are still the trainer's: NFT needs nothing of the sampling
policy (no log-prob, no behaviour mean), only the clean sample, so stale samples are simply off-policy data.

Source: NVlabs/DiffusionNFT, ``scripts/train_nft_sd3.py`` (``main``: the advantages of ``PerPromptStatTracker``,
the per-sample ``perms_time``, the timestep loop with ``positive_prediction``, ``implicit_negative_prediction``,
the two ``weight_factor``\\ s and ``ori_policy_loss``; ``return_decay`` and the soft update of the old
parameters at the end of an epoch), ``config/nft.py`` and ``config/base.py`` (commit 24af555).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from digenrl.algo.timesteps import stable_seed

WEIGHT_MIN = 1e-5  # the reference's .clip(min=0.00001) of the adaptive weight


def optimality(advantages: torch.Tensor, adv_clip_max: float) -> torch.Tensor:
    """r = clamp(A / c / 2 + 1/2, 0, 1): the group advantage (already clipped to [-c, c]) mapped to [0, 1]."""
    return torch.clamp(advantages / adv_clip_max / 2.0 + 0.5, 0.0, 1.0)


def implicit_velocities(v: torch.Tensor, v_old: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(v+, v-) = (beta v + (1 - beta) v_old, (1 + beta) v_old - beta v), v_old detached."""
    v_old = v_old.detach()
    return beta * v + (1.0 - beta) * v_old, (1.0 + beta) * v_old - beta * v


def forward_noise(x0: torch.Tensor, eps: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """x_t = (1 - t) x0 + t eps, ``t`` per sample ([B])."""
    tt = t.reshape(-1, *([1] * (x0.ndim - 1))).to(x0.dtype)
    return (1 - tt) * x0 + tt * eps.to(x0.dtype)


def _weighted_error(x0_hat: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """mean((x0_hat - x0)^2) / max(mean|x0_hat - x0|, 1e-5), the weight detached (per sample)."""
    dims = tuple(range(1, x0.ndim))
    with torch.no_grad():
        w = (x0_hat.detach().double() - x0.double()).abs().mean(dim=dims, keepdim=True).clamp_min(WEIGHT_MIN)
    return ((x0_hat - x0) ** 2 / w.to(x0_hat.dtype)).mean(dim=dims)


@dataclass
class NFTLossStats:
    old_deviate: torch.Tensor  # mean((v - v_old)^2): 0 on policy (the reference's "old_deviate")


def nft_parts(v: torch.Tensor, v_old: torch.Tensor, x_t: torch.Tensor, x0: torch.Tensor, t: torch.Tensor, *,
              beta: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(L+, L-) per sample: the adaptively weighted x0 errors of the implicit positive and negative velocities."""
    if beta <= 0:
        raise ValueError(f"DiffusionNFT's beta must be > 0, got {beta}")
    tt = t.reshape(-1, *([1] * (x0.ndim - 1))).to(v.dtype)
    x0 = x0.to(v.dtype)
    v_pos, v_neg = implicit_velocities(v, v_old, beta)
    return _weighted_error(x_t - tt * v_pos, x0), _weighted_error(x_t - tt * v_neg, x0)


def linear_parts(pos: torch.Tensor, neg: torch.Tensor, *, beta: float = 1.0, adv_clip_max: float = 5.0
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(l, m) with L = A l + m for every |A| <= c (the advantages are clipped to c, so the clamp of r never
    acts): l = (L+ - L-) / (2 beta), m = c (L+ + L-) / (2 beta). The loss is affine in A with no branch, which
    is what a pipelined trainer needs to train before the step-wide advantage scale is known
    (``train.loss_scale.DeferredRound``, ``algo.deferred_std``: l is both branches, m an A-free term like the KL)."""
    return (pos - neg) / (2.0 * beta), adv_clip_max * (pos + neg) / (2.0 * beta)


def nft_loss(v: torch.Tensor, v_old: torch.Tensor, x_t: torch.Tensor, x0: torch.Tensor, t: torch.Tensor,
             r: torch.Tensor, *, beta: float = 1.0, adv_clip_max: float = 5.0) -> tuple[torch.Tensor, NFTLossStats]:
    """Per-sample loss c (r L+ + (1 - r) L-) / beta (module docstring, no reduction over samples) and its
    detached statistics."""
    pos, neg = nft_parts(v, v_old, x_t, x0, t, beta=beta)
    r = r.to(pos.dtype)
    loss = adv_clip_max * (r * pos + (1.0 - r) * neg) / beta
    with torch.no_grad():
        stats = NFTLossStats(((v - v_old) ** 2).mean())
    return loss, stats


def velocity_kl(v: torch.Tensor, v_ref: torch.Tensor) -> torch.Tensor:
    """The reference's KL term per sample: mean((v - v_ref)^2) over the latent's elements."""
    return ((v - v_ref.detach()) ** 2).mean(dim=tuple(range(1, v.ndim)))


def slot_timestep_index(trajectory_seed: int, slot: int, num_points: int) -> int:
    """Index into the sampling schedule's first ``num_points`` sigmas of the timestep of training slot ``slot``
    (distinct slots of one sample get distinct points: a seeded permutation, module docstring)."""
    if not 0 <= slot < num_points:
        raise ValueError(f"training slot {slot} out of range for {num_points} schedule points")
    gen = torch.Generator().manual_seed(stable_seed(int(trajectory_seed), "nft_t"))
    return int(torch.randperm(num_points, generator=gen)[slot])


def slot_noise(trajectory_seed: int, slot: int, shape: tuple[int, ...]) -> torch.Tensor:
    """The forward-process noise eps of training slot ``slot`` (float32, CPU)."""
    gen = torch.Generator().manual_seed(stable_seed(int(trajectory_seed), "nft_eps", int(slot)))
    return torch.randn(shape, generator=gen)
