"""The colocated reference loop: the semantics every other execution mode must reproduce (invariant I1).

    for each step k:
        prompts  <- task(k);  trajectories <- sample(policy_k, prompts x G)      (SDE, log-probs recorded)
        rewards  <- reward(decode(x_0));  advantages <- group-normalised rewards
        [train.zero_adv_refill: re-add seeded zero-advantage samples until kept is a multiple of P G / micro_batch]
        for each inner epoch, for each minibatch m = 1..M (groups split by index, docs/architecture.md; or
                train.minibatch_split=samples: part m of a seeded permutation of the kept samples; or
                train.minibatch_split=generations: block m of every group's generations):
            for each group of m, for each chunk of its (generation x timestep) grid: accumulate grad of the loss
            commit m (one optimizer step; logp_old stays the behaviour log-prob, so from m = 2 on r != 1);
                EMA (k updates: train.ema_update)
        publish: policy_{k+1} after the last commit;  eval every N steps

It does not use the scheduler or the executors (it is their oracle): its minibatch membership is its own. It
shares the step's math (``train.step_work``, ``train.loss_scale``), the run outputs
(``observe.run_outputs.RunOutputs``) and the chunk tiling (``schedule.layout.tile_grid``, pure): the loss is a
sum over cells, so any tiling gives the same gradient up to rounding, and ``tests/train/test_chunked_training.py``
checks the tiled gradient against a per-timestep reference that uses no tiling at all.
"""

from __future__ import annotations

import time

from digenrl.config import Config
from digenrl.observe.run_dir import RunStart
from digenrl.observe.run_outputs import RunOutputs, checkpoint_bytes
from digenrl.rollout.records import TrajectoryBatch
from digenrl.train import checkpoint as ckpt
from digenrl.train.chunk_loss import CellStats
from digenrl.train.context import RunContext, build_context
from digenrl.train.evaluate import evaluate
from digenrl.train.interrupt import StopRequest
from digenrl.train.loss_scale import loss_scale
from digenrl.train.nft_old import after_commit, sampling_weights
from digenrl.train.step_work import (advantage_options, assign_advantages, best_of_n, generate, kept_count, reward_stats,
                                     sample_minibatches, split_groups, train_group, zero_adv_refill)


def colocated_step(ctx: RunContext, step: int) -> dict[str, float]:
    """One on-policy step in a single process; returns its metrics."""
    cfg, t = ctx.cfg, ctx.cfg.train
    timings, t0 = {}, time.perf_counter()
    prompts = ctx.task.train_prompts(step, t.prompts_per_step, cfg.seed)
    plan = ctx.plan(step)
    rep = [p for p in prompts for _ in range(t.generations)]
    gens = [g for _ in prompts for g in range(t.generations)]
    with sampling_weights(ctx.policy):  # DiffusionNFT's old copy (train.nft_old_policy=soft), else the policy
        batch = generate(ctx.policy, rep, gens, step=step, run_seed=cfg.seed, version=ctx.transaction.version, settings=ctx.sampler, plan=plan, reward=ctx.reward)
    timings["timing_s/gen"] = time.perf_counter() - t0
    adv = assign_advantages(batch, **advantage_options(t))

    t1 = time.perf_counter()
    groups = split_groups(batch)
    if t.best_of_n is not None:
        groups = [best_of_n(g, cfg) for g in groups]
    if t.zero_adv_refill:  # Flow-GRPO's re-added zero-advantage samples (train.step_work.zero_adv_refill)
        keeps = zero_adv_refill([g.advantages for g in groups], run_seed=cfg.seed, step=step,
                                micro_batches=t.prompts_per_step * t.generations // t.micro_batch)
        for g, k in zip(groups, keeps):
            g.keep = k
    readded = sum(int(g.keep.sum()) - kept_count(g.advantages, True) for g in groups if g.keep is not None)
    results = train_minibatches(ctx, step, groups, len(plan.trained))
    stats = CellStats()
    for st, _ in results:
        stats = stats.add(st)
    timings["timing_s/train"] = time.perf_counter() - t1
    norms = [c["grad_norm"] for _, c in results]
    commit = {"grad_norm": sum(norms) / len(norms)}
    timings["timing_s/commit"] = sum(c["commit_s"] for _, c in results)
    step_s = time.perf_counter() - t0
    return {**reward_stats(batch), **stats.means(), **commit, "zero_std_ratio": adv.zero_std_ratio,
            "kept_fraction": (kept_count(batch.advantages, t.filter_zero_advantage) + readded) / len(batch),
            "cells": stats.cells,
            **timings, "step_s": step_s, "samples_per_s": len(batch) / step_s}


def train_minibatches(ctx: RunContext, step: int, groups: list[TrajectoryBatch], num_trained: int) -> list[tuple[CellStats, dict]]:
    """Train a step's complete groups (in the step's prompt order) as ``inner_epochs`` x M minibatches.

    Minibatch m holds the groups of indices ceil(m P / M) .. ceil((m + 1) P / M) - 1 (contiguous blocks by prompt
    index, written here apart from the scheduler's ``minibatch_of`` so that this oracle does not share the rule
    it checks); each ends in its own commit with the loss
    scale of ``train.loss_scale`` (1 / S per cell, 1 / kept trajectories of m at the commit; kept = all, or
    those with a non-zero advantage); the version is bumped by the very last commit only. Returns (cell stats,
    commit info) per commit, in order. ``train.minibatch_split=samples``: minibatch m of each inner epoch is
    instead part m of a seeded permutation of the step's kept samples (``step_work.sample_minibatches``);
    ``generations``: minibatch m holds the generations ceil(m G / M) .. ceil((m + 1) G / M) - 1 of every group
    (MixGRPO's optimizer step takes 3 of each prompt's 12 generations).
    """
    t = ctx.cfg.train
    M, P = t.minibatches_per_step, len(groups)
    bounds = [-(-m * P // M) for m in range(M + 1)]  # ceil(m P / M)
    members = [groups[bounds[m]:bounds[m + 1]] for m in range(M)]
    if t.minibatch_split == "generations":
        gb = [-(-m * t.generations // M) for m in range(M + 1)]  # ceil(m G / M)
        members = [[b for b in (g.select([r for r, j in enumerate(g.gen_index.tolist()) if gb[m] <= j < gb[m + 1]])
                                for g in groups) if len(b)] for m in range(M)]
    out = []
    for epoch in range(t.inner_epochs):
        if t.minibatch_split == "samples":
            members = sample_minibatches(groups, M, run_seed=ctx.cfg.seed, step=step, epoch=epoch,
                                         filter_zero_advantage=t.filter_zero_advantage)
        for m, mb in enumerate(members):
            scale = loss_scale(num_trained, [g.advantages for g in mb], t.filter_zero_advantage, [g.keep for g in mb])
            cells = {(g.prompts[0].uid, gen, j) for g in mb for gen in g.gen_index.tolist() for j in range(num_trained)}
            ctx.transaction.begin(step, cells)
            stats = CellStats()
            for g in mb:
                stats = stats.add(train_group(ctx.policy, g, settings=ctx.loss, loss_scale=scale.cell(),
                                              chunk_generations=t.chunk_generations, chunk_timesteps=t.chunk_timesteps,
                                              ref_policy=ctx.ref_policy, record=ctx.transaction.record))
            tc = time.perf_counter()
            commit = ctx.transaction.commit(final=epoch == t.inner_epochs - 1 and m == M - 1, loss=stats.loss,
                                            grad_scale=scale.commit)
            if ctx.ema is not None:
                ctx.ema.update()
            after_commit(ctx.policy, epoch == t.inner_epochs - 1 and m == M - 1)  # DiffusionNFT's old copy
            commit["commit_s"] = time.perf_counter() - tc
            out.append((stats, commit))
    return out


def run_training(cfg: Config, *, ctx: RunContext | None = None, start: RunStart | None = None,
                 stop: StopRequest | None = None) -> dict:
    """Train with ``cfg`` in the colocated reference loop and write every run output; returns the summary.

    ``start``: how to use ``run_dir`` (``plan_run_dir``; default a fresh run), possibly resuming a checkpoint.
    ``stop``: polled after each step; a requested stop checkpoints and raises ``Interrupted``.
    """
    from tqdm import tqdm

    import torch

    torch.set_num_threads(cfg.runtime.threads_per_worker)
    ctx = ctx or build_context(cfg)
    first, counters = ckpt.resume(ctx, start)
    out = RunOutputs(cfg, start)
    eval_prompts = ctx.task.eval_prompts(cfg.eval.num_prompts)

    def run_eval():
        with ctx.eval_weights():
            return evaluate(ctx.policy, eval_prompts, ctx.reward, ctx.sampler, run_seed=cfg.seed, num_steps=cfg.sampler.eval_num_steps)

    def weights() -> bytes:  # the eval weights as checkpoint bytes (eval.guard_action=checkpoint keeps them)
        with ctx.eval_weights():
            return checkpoint_bytes(ctx.policy, {"steps": str(ctx.transaction.version), "guard": "pre-divergence"})

    try:
        if first:  # resumed: the initial eval and its grid are in run_dir already
            out.restore(counters)
        else:
            out.before(*run_eval(), weights=weights)
        t_start, eval_r = time.perf_counter() - counters.get("wall_s", 0.0), counters.get("eval_reward", out.eval0)

        def save(done: int):
            c = {"eval0": out.eval0, "eval_reward": eval_r, "wall_s": time.perf_counter() - t_start, **out.counters()}
            return ckpt.save_train_state(ctx, out.run_dir, step=done, keep=cfg.runtime.keep_checkpoints, counters=c)

        bar = tqdm(range(first, cfg.steps), desc="train", disable=not cfg.log.progress, initial=first, total=cfg.steps)
        for step in bar:
            row = {"step": step + 1, **colocated_step(ctx, step)}
            if cfg.eval.every and (step + 1) % cfg.eval.every == 0 and step + 1 < cfg.steps:
                eval_r, eval_batch = run_eval()
                row.update(eval_reward=eval_r, **out.mid_eval(step + 1, eval_r, eval_batch, weights))
            out.log(row)
            bar.set_postfix(reward=f"{row['reward_mean']:.3f}", eval=f"{eval_r:.3f}", sps=f"{row['samples_per_s']:.0f}")
            stopping = stop is not None and stop.requested
            last = step + 1 == cfg.steps  # a finished run can be extended: --resume RUN_DIR steps=<more>
            guarded = out.guard_stop is not None  # eval.guard_action=stop: the run ends after this step
            if stopping or guarded or ckpt.due(step + 1, cfg.runtime.checkpoint_every) or (last and cfg.runtime.checkpoint_every):
                path = save(step + 1)
                if stopping:
                    stop.check(step + 1, path)
            if guarded:
                break
        wall = time.perf_counter() - t_start
        out.after(*((eval_r, eval_batch) if out.guard_stop is not None else run_eval()))
        version = ctx.transaction.version
        done = cfg.steps if out.guard_stop is None else out.guard_stop["step"]
        with ctx.eval_weights():
            out.write_checkpoint(checkpoint_bytes(ctx.policy, {"steps": str(done), "version": str(version)}))
        return out.finish(wall_s=wall, version=version)
    finally:
        out.close()
