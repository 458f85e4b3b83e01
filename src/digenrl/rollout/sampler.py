"""Sampling a batch of trajectories with the SDE sampler, recording what training needs.

For denoising step i (sigma_i -> sigma_{i+1}) the velocity comes from the policy (after CFG), and the step is
``sde_step_with_logprob`` with ``noise_level`` on SDE steps and 0 (Euler ODE) elsewhere. For every trained
step the input latent, output latent and behaviour log-prob are kept (see ``TrajectoryBatch``), and with
``record_means`` the transition's mean (GRPO-Guard's RatioNorm needs the behaviour mean: ``algo.guard``).
MixGRPO-Flash (``post_solver="dpmpp_2m"``, ``post_compress_ratio``): after the plan's last SDE step L the ODE
takes DPM-Solver++ 2M steps on a schedule rebuilt with fewer steps (``algo.dpm``); the steps up to L are as
above, so the trained cells do not change. A plan without SDE steps (evaluation, DiffusionNFT) keeps the Euler
ODE, or with ``ode_solver="dpmpp_2m"`` (DiffusionNFT's ``sample.solver = "dpm2"``: ``sampler.nft_solver``) takes
DPM-Solver++ 2M from the first step (first order at the first step, which has no history, and at the last).
Without ``record_cells`` (DiffusionNFT trains on x_0 alone: ``algo.nft``) no transition is kept: the
latents and log-probs are empty ([N, 0, ...]) and ``trained_steps`` lists the plan's training slots.

Sampling runs with the policy in eval mode (dropout off), as Flow-GRPO samples: the behaviour log-probs are
those of the deterministic policy, so on-policy the first minibatch's ratio is exactly 1. The mode the policy
was in is restored after. With ``same_latent`` every generation of a prompt group starts from the same initial
noise (Flow-GRPO's ``sample.same_latent``, DanceGRPO's ``init_same_noise``), drawn from the group's seed
(run seed, step, prompt uid); the SDE noise stays per trajectory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from digenrl.algo.dpm import dpmpp_2m, dpmpp_first_order, post_window_sigmas
from digenrl.algo.sde import sde_step_with_logprob
from digenrl.algo.timesteps import TimestepPlan
from digenrl.models.base import Policy, guided_velocity
from digenrl.rollout.noise import group_initial_noise, trajectory_noise, trajectory_seed
from digenrl.rollout.records import Prompt, TrajectoryBatch


@dataclass(frozen=True)
class SamplerSettings:
    num_steps: int = 10
    noise_level: float = 0.7
    kind: str = "flow_grpo"
    cfg_scale: float = 1.0
    eval_cfg_scale: float | None = None  # ODE evaluation's guidance scale (None: cfg_scale)
    same_latent: bool = False
    static_shift: float | None = None  # DanceGRPO's schedule: shift * t / (1 + (shift - 1) t), t = linspace(1, 0, T + 1)
    integer_timesteps: bool = False  # the model sees int(sigma * 1000) / 1000 (DanceGRPO)
    record_means: bool = False  # keep each trained transition's mean (train.algorithm=grpo_guard's RatioNorm)
    post_solver: str = "euler"  # "dpmpp_2m": the ODE steps after the last SDE step (MixGRPO-Flash, algo.dpm)
    post_compress_ratio: float = 1.0  # < 1: MixGRPO-Flash's shorter schedule after the last SDE step (algo.dpm)
    record_cells: bool = True  # False (train.algorithm=nft): no transition recorded, only x_0 (algo.nft)
    ode_solver: str = "euler"  # "dpmpp_2m": a trajectory without SDE steps (nft) takes DPM-Solver++ 2M (algo.dpm)


@torch.no_grad()
def sample_trajectories(
    policy: Policy,
    prompts: Sequence[Prompt],
    gen_indices: Sequence[int],
    *,
    step: int,
    run_seed: int,
    version: int,
    settings: SamplerSettings,
    plan: TimestepPlan,
    decode: bool = True,
) -> TrajectoryBatch:
    """Generate one trajectory per (prompt, generation index) pair."""
    if len(prompts) != len(gen_indices):
        raise ValueError("prompts and gen_indices must have the same length")
    device = next(policy.parameters()).device
    n, T = len(prompts), settings.num_steps
    sigmas = policy.sigmas(T).float() if settings.static_shift is None else static_shift_sigmas(T, settings.static_shift)
    last_sde = max(plan.sde_steps) if plan.sde_steps else -1
    if settings.post_compress_ratio < 1.0 and last_sde >= 0:
        if settings.static_shift is None:
            raise ValueError("sampler.post_compress_ratio < 1 rebuilds MixGRPO's static-shift schedule: it needs "
                             "sampler.static_shift")
        sigmas = post_window_sigmas(T, last_sde, settings.static_shift, settings.post_compress_ratio)
    seeds = [trajectory_seed(run_seed, step, p.uid, g) for p, g in zip(prompts, gen_indices)]
    noises = [trajectory_noise(s, tuple(policy.latent_shape), T) for s in seeds]
    if settings.same_latent:
        x = torch.stack([group_initial_noise(run_seed, step, p.uid, tuple(policy.latent_shape)) for p in prompts]).to(device)
    else:
        x = torch.stack([nz[0] for nz in noises]).to(device)
    eps = torch.stack([nz[1] for nz in noises], dim=1).to(device)  # [T, N, ...]
    cond = policy.encode_prompts(list(prompts))
    sde_steps, trained = set(plan.sde_steps), list(plan.trained) if settings.record_cells else []
    lat_in, lat_out, logps = [], [], []
    means = [] if settings.record_means else None
    was_training = policy.training
    policy.eval()
    try:
        x, images = _denoise(policy, x, eps, cond, sigmas, settings, sde_steps, trained, lat_in, lat_out, logps, decode,
                             means)
    finally:
        policy.train(was_training)
    shape = (n, 0, *policy.latent_shape)
    return TrajectoryBatch(
        prompts=list(prompts),
        gen_index=torch.as_tensor(list(gen_indices), dtype=torch.long),
        step=torch.full((n,), step, dtype=torch.long),
        version=torch.full((n,), version, dtype=torch.long),
        seed=torch.as_tensor(seeds, dtype=torch.long),
        sigmas=sigmas.cpu(),
        trained_steps=torch.as_tensor(list(plan.trained), dtype=torch.long),
        latents=torch.stack(lat_in, 1).cpu() if lat_in else torch.empty(shape),
        next_latents=torch.stack(lat_out, 1).cpu() if lat_out else torch.empty(shape),
        log_probs=torch.stack(logps, 1).float().cpu() if logps else torch.empty(n, 0),
        final=x.cpu(),
        images=images,
        means=None if means is None else (torch.stack(means, 1).float().cpu() if means else torch.empty(shape)),
    )


def static_shift_sigmas(num_steps: int, shift: float) -> torch.Tensor:
    """DanceGRPO's sigma schedule (``sd3_time_shift`` on ``linspace(1, 0, T + 1)``), float32, ends at 0."""
    t = torch.linspace(1, 0, num_steps + 1)
    return (shift * t) / (1 + (shift - 1) * t)


def _denoise(policy, x, eps, cond, sigmas, settings, sde_steps, trained, lat_in, lat_out, logps, decode, means=None):
    n, device = x.shape[0], x.device
    last_sde = max(sde_steps) if sde_steps else -1
    dpm = (settings.post_solver == "dpmpp_2m" and last_sde >= 0) or (settings.ode_solver == "dpmpp_2m" and last_sde < 0)
    x0_prev = None
    steps = len(sigmas) - 1  # num_steps, or fewer after MixGRPO-Flash's compressed tail
    for i in range(steps):
        sig = sigmas[i].expand(n).to(device)
        v = guided_velocity(policy, x, sig, cond, settings.cfg_scale, integer_timesteps=settings.integer_timesteps)
        if dpm and i > last_sde:  # MixGRPO-Flash: DPM-Solver++ 2M on the data prediction (first order at the end)
            x0 = x - sigmas[i].to(device) * v
            if i == steps - 1 or x0_prev is None:  # (the first step of a DPM-only trajectory: no history)
                x = dpmpp_first_order(x, x0, sigmas[i], sigmas[i + 1]).to(x.dtype)
            else:
                x = dpmpp_2m(x, x0, x0_prev, sigmas[i - 1], sigmas[i], sigmas[i + 1]).to(x.dtype)
            x0_prev = x0
            continue
        if dpm:
            x0_prev = x - sigmas[i].to(device) * v
        level = settings.noise_level if i in sde_steps else 0.0
        out = sde_step_with_logprob(x, v, sigmas[i], sigmas[i + 1], noise_level=level, kind=settings.kind, noise=eps[i])
        if i in trained:
            lat_in.append(x)
            lat_out.append(out.prev_sample)
            logps.append(out.log_prob)
            if means is not None:
                means.append(out.mean)
        x = out.prev_sample
    return x, (policy.decode(x).float().cpu() if decode else None)
