"""The colocated reference loop: the semantics every other execution mode must reproduce (invariant I1).

    for each step k:
        prompts  <- task(k);  trajectories <- sample(policy_k, prompts x G)      (SDE, log-probs recorded)
        rewards  <- reward(decode(x_0));  advantages <- group-normalised rewards
        for each group, for each chunk of its (generation x timestep) grid: accumulate grad of the loss
        commit (one optimizer step) -> policy_{k+1};  EMA;  eval every N steps
"""

from __future__ import annotations

import time

from digenrl.config import Config
from digenrl.observe.metrics import MetricsWriter
from digenrl.observe.run_outputs import RunStart, finish_run, kept_metrics, prepare_run_dir, save_checkpoint, write_grid
from digenrl.train import checkpoint as ckpt
from digenrl.train.context import RunContext, build_context
from digenrl.train.evaluate import evaluate
from digenrl.train.interrupt import StopRequest
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
    run_dir = prepare_run_dir(cfg, start)
    writer = MetricsWriter(run_dir, tensorboard=cfg.log.tensorboard, wandb=cfg.log.wandb, wandb_project=cfg.log.wandb_project,
                           config=cfg.model_dump(mode="json"), rows=kept_metrics(run_dir, first) if first else None)
    eval_prompts = ctx.task.eval_prompts(cfg.eval.num_prompts)

    def run_eval():
        with ctx.eval_weights():
            return evaluate(ctx.policy, eval_prompts, ctx.reward, ctx.sampler, run_seed=cfg.seed, num_steps=cfg.sampler.eval_num_steps)

    if first:  # resumed: the initial eval and its grid are in run_dir already
        eval0, before = counters["eval0"], None
    else:
        eval0, before = run_eval()
        write_grid(run_dir, "samples_before.png", before, cfg.eval.grid_prompts, f"before RL (eval reward {eval0:.3f})")
        writer.log({"step": 0, "eval_reward": eval0})
    t_start, samples, eval_r = time.perf_counter() - counters.get("wall_s", 0.0), counters.get("samples", 0), counters.get("eval_reward", eval0)

    def save(done: int):
        c = {"eval0": eval0, "eval_reward": eval_r, "wall_s": time.perf_counter() - t_start, "samples": samples}
        return ckpt.save_train_state(ctx, run_dir, step=done, keep=cfg.runtime.keep_checkpoints, counters=c)

    bar = tqdm(range(first, cfg.steps), desc="train", disable=not cfg.log.progress, initial=first, total=cfg.steps)
    for step in bar:
        row = {"step": step + 1, **colocated_step(ctx, step)}
        samples += cfg.train.prompts_per_step * cfg.train.generations
        if cfg.eval.every and (step + 1) % cfg.eval.every == 0 and step + 1 < cfg.steps:
            eval_r, _ = run_eval()
            row["eval_reward"] = eval_r
        writer.log(row)
        bar.set_postfix(reward=f"{row['reward_mean']:.3f}", eval=f"{eval_r:.3f}", sps=f"{row['samples_per_s']:.0f}")
        stopping = stop is not None and stop.requested
        last = step + 1 == cfg.steps  # a finished run can be extended: --resume RUN_DIR steps=<more>
        if stopping or ckpt.due(step + 1, cfg.runtime.checkpoint_every) or (last and cfg.runtime.checkpoint_every):
            path = save(step + 1)
            if stopping:
                writer.close()
                stop.check(step + 1, path)
    wall = time.perf_counter() - t_start
    eval1, after = run_eval() if cfg.steps else (eval0, before)
    writer.log({"step": cfg.steps, "eval_reward": eval1, "final": True})
    writer.close()
    write_grid(run_dir, "samples_after.png", after, cfg.eval.grid_prompts, f"after {cfg.steps} RL steps (eval reward {eval1:.3f})")
    with ctx.eval_weights():
        save_checkpoint(ctx.policy, run_dir, {"steps": str(cfg.steps), "version": str(ctx.transaction.version)})
    summary = {
        "eval_reward_initial": eval0, "eval_reward_final": eval1, "steps": cfg.steps, "wall_s": wall,
        "samples_per_s": samples / wall if wall > 0 else 0.0, "mode": cfg.runtime.mode, "version": ctx.transaction.version,
    }
    finish_run(run_dir, writer.rows, summary, title=f"{cfg.task.name}: eval {eval0:.3f} -> {eval1:.3f}")
    return summary
