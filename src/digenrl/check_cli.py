"""``digenrl check``: is this config ready to train? Nothing is written; Ray is never imported, no GPU touched.

It validates the config, resolves ``train.chunk_cells: auto``, prints the resolved config, the memory plan per
trainer rank and per generator and the planned split (with ``runtime.profile``, the predicted step time), then
checks the run's inputs on this machine (``validate.problems``), one line each. Exit 0 when ``digenrl train``
would start, 2 otherwise. ``--config-only`` skips the inputs (a preset checked on a machine without its model).
"""

from __future__ import annotations

import argparse
import sys


def _memory_lines(cfg) -> list[str]:
    from digenrl.train.memory import GiB, plan_memory
    from digenrl.train.memory_check import chunk_cells, generator_items, inputs_from_config, trainer_generation_batch
    p = inputs_from_config(cfg)
    if p is None:
        return [f"  (no memory plan for model.kind={cfg.model.kind}: only the diffusers families have one)"]
    cap = cfg.train.memory_gb
    plan = plan_memory(p)
    cells = chunk_cells(cfg)
    total = plan.total(cells) / GiB
    room = f" of train.memory_gb={cap:g}" if cap is not None else " (train.memory_gb unset: not checked)"
    out = [f"  trainer rank: {total:.1f} GiB{room}, chunk of {cells} cells ({plan.table(cells)})"]
    bound = trainer_generation_batch(cfg)
    if bound is not None:
        from digenrl.schedule.plan import Mode

        out.append(f"  trainer rank sampling (evals{', TAG' if Mode(cfg.runtime.mode).tag else ''}"
                   f"{', its share of each step' if cfg.runtime.mode == 'colocated' else ''}): at most {bound} "
                   "samples per batch beside its state" + (f" (sampler.batch_size: {b})" if (b := cfg.sampler.batch_size)
                                                           and b < bound else ""))
    if cfg.runtime.mode != "colocated":
        gen = generator_items(cfg, p)
        rows = ", ".join(f"{k} {v / GiB:.1f}" for k, v in gen.items() if v > 0)
        out.append(f"  generator: {sum(gen.values()) / GiB:.1f} GiB{room if cap is not None else ''}, fragments of "
                   f"{cfg.fragment_generations()} ({rows})")
    return out


def _split_lines(run) -> list[str]:
    cfg, plan = run.cfg, run.plan
    rt, t = cfg.runtime, cfg.train
    gens, trns = len(run.generator_ids), len(run.trainer_ids)
    if rt.mode == "colocated":
        pools = f"{trns} colocated worker(s) (each generates, then trains)"
    else:
        unit = "GPUs" if cfg.model.device.startswith("cuda") else "workers"
        pools = f"{gens} generator(s) + {trns} trainer rank(s) = {gens + trns} {unit}"
    if t.sharding == "fsdp":
        pools += f", FSDP in {t.shard_groups} shard group(s) of {trns // t.shard_groups}"
    return [f"  mode {rt.mode}: {pools}",
            f"  step: {t.prompts_per_step} prompts x {t.generations} generations = {plan.batch} trajectories of "
            f"{cfg.sampler.num_steps} denoising steps, {run.trained_timesteps} trained timesteps each; "
            f"{t.minibatches_per_step * t.inner_epochs} optimizer step(s) per step; {cfg.steps} steps",
            f"  fragments of {cfg.fragment_generations()} generations, chunks of {t.chunk_generations} x "
            f"{t.chunk_timesteps} cells, publish {rt.publish}"
            + (f", stale cap {rt.max_stale_fraction:g}" if rt.mode == "full" else "")]


def main(argv: list[str] | None = None) -> int:
    from digenrl.cli_args import add_overrides, parse_with_overrides

    ap = argparse.ArgumentParser(prog="digenrl check", description="Validate a config, print the resolved config, "
                                 "the memory plan and the planned split, and check the run's inputs on this "
                                 "machine; starts nothing (no Ray, no GPU). Exit 0: `digenrl train` would start.")
    ap.add_argument("--config", "-c", default=None, help="YAML config or preset:NAME (default: the built-in CPU demo)")
    ap.add_argument("--config-only", action="store_true",
                    help="skip the checks of model files, prompts, caches and devices on this machine")
    ap.add_argument("--quiet", "-q", action="store_true", help="do not print the resolved config")
    args = parse_with_overrides(add_overrides(ap), argv)

    from digenrl.cli import _fail, _plan_memory, _with_adapter
    from digenrl.config import ConfigError, dump_config, load_config
    from digenrl.control.run_plan import plan_run

    try:
        cfg = load_config(args.config, args.overrides)
        if not args.config_only:
            cfg = _with_adapter(cfg)  # model.lora from model.lora_path's adapter (reads its files)
        cfg = _plan_memory(cfg)  # refuses what does not fit train.memory_gb; resolves chunk_cells: auto
        run = plan_run(cfg)
    except ConfigError as e:
        return _fail(str(e))
    if not args.quiet:
        print("# resolved config")
        print(dump_config(cfg).rstrip())
    print("memory plan (train/memory.py):")
    print("\n".join(_memory_lines(cfg)))
    print("planned split:")
    print("\n".join(_split_lines(run)))
    from digenrl.sim.prediction import predict, report

    line, warn = report(cfg, predict(cfg))
    for text in (line, warn):
        if text:
            print(f"  {text}")
    if args.config_only:
        print("inputs: not checked (--config-only)")
        return 0
    from digenrl.validate import eval_warnings, problems as input_problems

    for warning in eval_warnings(cfg):
        print(f"warning: {warning}")
    problems = input_problems(cfg)
    if problems:
        print(f"inputs: {len(problems)} problem(s); `digenrl train` would refuse this config:")
        for p in problems:
            print(f"  {p}")
        return 2
    print("inputs: ok; `digenrl train` would start")
    return 0


if __name__ == "__main__":
    sys.exit(main())
