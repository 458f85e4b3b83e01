"""Helpers of the training tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations


def scored_groups(policy, overrides, ties=()):
    """(context, prompt groups) of step 0 of the config ``overrides`` (4 prompts x 4 generations), sampled by
    ``policy``, scored with seeded random rewards (the groups in ``ties``: every reward 0.5) and their advantages
    assigned: the input of a step's training, without the loop around it."""
    import torch

    from digenrl.config import load_config
    from digenrl.train.context import build_context
    from digenrl.train.step_math import adv_options, assign_advantages, generate

    cfg = load_config(None, list(overrides))
    ctx = build_context(cfg, policy=policy)
    prompts = ctx.task.train_prompts(0, 4, cfg.seed)
    rep = [p for p in prompts for _ in range(4)]
    gens = [g for _ in prompts for g in range(4)]
    batch = generate(ctx.policy, rep, gens, step=0, run_seed=cfg.seed, version=0, settings=ctx.sampler,
                     plan=ctx.plan(0), reward=ctx.reward)
    batch.rewards = torch.rand(len(batch), generator=torch.Generator().manual_seed(1))
    for g in ties:
        batch.rewards[4 * g: 4 * g + 4] = 0.5
    assign_advantages(batch, adv_options(cfg.train))
    return ctx, split_groups(batch)


def split_groups(batch):
    """The prompt groups of a batch, in order of first appearance."""
    uids = batch.uids.tolist()
    return [batch.select([i for i, u in enumerate(uids) if u == g]) for g in dict.fromkeys(uids)]


def train_group(policy, group, *, settings, loss_scale, chunk_generations, chunk_timesteps, ref_policy=None,
                record=None, step_start=True):
    """Every cell of one prompt group through ``train_cells``, chunk by chunk (``schedule.layout.tile_grid``): the
    trainers' work on a group without the scheduler around it."""
    from digenrl.schedule.layout import tile_grid
    from digenrl.train.chunk_loss import CellStats, train_cells

    uid, total = group.prompts[0].uid, CellStats()
    for chunk in tile_grid(group.gen_index.tolist(), len(group.trained_steps), chunk_generations, chunk_timesteps):
        if record is not None:
            record([(uid, g, t) for g, t in chunk])
        total = total.add(train_cells(policy, group, chunk, settings=settings, loss_scale=loss_scale,
                                      ref_policy=ref_policy, step_start=step_start))
    return total


def sde_reference(x, v, sigma: float, sigma_next: float, a: float, x_next):
    """Flow-GRPO's SDE step written from its formula (docs/architecture.md, "The math"; sigma' in 1 - sigma where
    sigma = 1): (mean, transition std, log p(x_next | x) averaged over the non-batch dimensions)."""
    import math

    dt = sigma_next - sigma
    s = a * math.sqrt(sigma / (1 - (sigma if sigma < 1 else sigma_next)))
    mean = x * (1 + s**2 / (2 * sigma) * dt) + v * (1 + s**2 * (1 - sigma) / (2 * sigma)) * dt
    std = s * math.sqrt(-dt)
    lp = -((x_next - mean) ** 2) / (2 * std**2) - math.log(std) - math.log(math.sqrt(2 * math.pi))
    return mean, std, lp.mean(dim=tuple(range(1, lp.ndim)))
