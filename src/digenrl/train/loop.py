"""The colocated reference loop: the semantics every other execution mode must reproduce (invariant I1).

    for each step k:
        prompts  <- task(k);  trajectories <- sample(policy_k, prompts x G)      (SDE, log-probs recorded)
        rewards  <- reward(decode(x_0));  advantages <- group-normalised rewards
        for each group, for each chunk of its (generation x timestep) grid: accumulate grad of the loss
        commit (one optimizer step) -> policy_{k+1};  EMA;  eval every N steps

It shares nothing with the scheduler or the executors (it is their oracle), only the run outputs
(``observe.run_outputs.RunOutputs``).
"""

from __future__ import annotations

import time

from digenrl.config import Config
from digenrl.observe.run_outputs import RunOutputs, checkpoint_bytes
from digenrl.train.context import RunContext, build_context
from digenrl.train.evaluate import evaluate
from digenrl.train.step_work import assign_advantages, expected_cells, generate, reward_stats, split_groups, train_group


def colocated_step(ctx: RunContext, step: int) -> dict[str, float]:
    """One on-policy step in a single process; returns its metrics."""
    cfg, t = ctx.cfg, ctx.cfg.train
    timings, t0 = {}, time.perf_counter()
    prompts = ctx.task.train_prompts(step, t.prompts_per_step, cfg.seed)
    plan = ctx.plan(step)
    rep = [p for p in prompts for _ in range(t.generations)]
    gens = [g for _ in prompts for g in range(t.generations)]
    batch = generate(ctx.policy, rep, gens, step=step, run_seed=cfg.seed, version=ctx.transaction.version, settings=ctx.sampler, plan=plan, reward=ctx.reward)
    timings["timing_s/gen"] = time.perf_counter() - t0
    adv = assign_advantages(batch, std_mode=t.std_mode, adv_clip_max=t.adv_clip_max)

    t1 = time.perf_counter()
    ctx.transaction.begin(step, expected_cells(prompts, t.generations, len(plan.trained)))
    scale = 1.0 / (len(batch) * len(plan.trained))
    stats = None
    for group in split_groups(batch):
        s = train_group(ctx.policy, group, settings=ctx.loss, loss_scale=scale, chunk_generations=t.chunk_generations,
                        chunk_timesteps=t.chunk_timesteps, ref_policy=ctx.ref_policy, record=ctx.transaction.record)
        stats = s if stats is None else stats.add(s)
    timings["timing_s/train"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    commit = ctx.transaction.commit()
    if ctx.ema is not None:
        ctx.ema.update()
    timings["timing_s/commit"] = time.perf_counter() - t2
    step_s = time.perf_counter() - t0
    return {**reward_stats(batch), **stats.means(), **commit, "zero_std_ratio": adv.zero_std_ratio,
            **timings, "step_s": step_s, "samples_per_s": len(batch) / step_s}


def run_training(cfg: Config, *, ctx: RunContext | None = None) -> dict:
    """Train with ``cfg`` in the colocated reference loop and write every run output; returns the summary."""
    from tqdm import tqdm

    import torch

    torch.set_num_threads(cfg.runtime.threads_per_worker)
    ctx = ctx or build_context(cfg)
    out = RunOutputs(cfg)
    eval_prompts = ctx.task.eval_prompts(cfg.eval.num_prompts)

    def run_eval():
        with ctx.eval_weights():
            return evaluate(ctx.policy, eval_prompts, ctx.reward, ctx.sampler, run_seed=cfg.seed, num_steps=cfg.sampler.eval_num_steps)

    try:
        out.before(*run_eval())
        t_start, eval_r = time.perf_counter(), out.eval0
        bar = tqdm(range(cfg.steps), desc="train", disable=not cfg.log.progress)
        for step in bar:
            row = {"step": step + 1, **colocated_step(ctx, step)}
            if cfg.eval.every and (step + 1) % cfg.eval.every == 0 and step + 1 < cfg.steps:
                eval_r, _ = run_eval()
                row["eval_reward"] = eval_r
            out.log(row)
            bar.set_postfix(reward=f"{row['reward_mean']:.3f}", eval=f"{eval_r:.3f}", sps=f"{row['samples_per_s']:.0f}")
        wall = time.perf_counter() - t_start
        out.after(*run_eval())
        version = ctx.transaction.version
        with ctx.eval_weights():
            out.write_checkpoint(checkpoint_bytes(ctx.policy, {"steps": str(cfg.steps), "version": str(version)}))
        return out.finish(wall_s=wall, version=version)
    finally:
        out.close()
