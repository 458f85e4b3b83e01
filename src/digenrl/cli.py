"""``digenrl`` command line: train | pretrain | eval | sample, and the subcommands of ``FORWARDED``.

Configuration errors (unknown key, bad value, missing file, a run_dir another run is writing) print one message
naming the key or file and exit with code 2 before anything is written; how a started run ends (exit 1, 2, 74, a
signal's code) is ``_stopped``'s; a run ended by its reward-hacking guard (``eval.guard_action=stop``) exits 3.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_CONFIG = 2
EXIT_IO = 74  # sysexits EX_IOERR: the run could not write its outputs (disk full, read-only, I/O error)


def _fail(msg: str) -> int:
    print(f"digenrl: error: {msg}", file=sys.stderr)
    return EXIT_CONFIG


def _with_adapter(cfg):
    """``cfg`` with ``model.lora`` taken from the adapter of ``model.lora_path`` (so config.yaml records it)."""
    if not cfg.model.lora_path:
        return cfg
    from digenrl.models.lora_files import AdapterError, resolve_lora
    from digenrl.validate import refused

    with refused(AdapterError):
        return cfg.model_copy(update={"model": resolve_lora(cfg.model)})


def _load(args):
    """The config with ``model.lora`` from ``model.lora_path``'s adapter (the inputs are checked later); ``train
    --resume RUN_DIR`` reads RUN_DIR/config.yaml (unless --config) and keeps run_dir."""
    from digenrl.config import ConfigError, load_config

    path, overrides = args.config, args.overrides
    if getattr(args, "resume", None):
        run_dir = Path(args.resume)
        if path is None and not (run_dir / "config.yaml").is_file():
            raise ConfigError(f"--resume: {str(run_dir)!r} holds no run (no config.yaml)")
        path, overrides = path or run_dir / "config.yaml", [*overrides, f"run_dir={run_dir}"]
    return _with_adapter(load_config(path, overrides))


def _context(cfg):
    """Build policy, reward and task from the config; anything that fails here is bad input (exit 2)."""
    from digenrl.config import ConfigError
    from digenrl.observe.progress import phase
    from digenrl.train.context import build_context
    from digenrl.validate import validate_run

    validate_run(cfg, run=False)
    try:
        with phase(cfg, f"loading {cfg.model.kind} from {cfg.model.path or 'the built-in weights'}"):
            return build_context(cfg)
    except (ValueError, KeyError, FileNotFoundError, NotADirectoryError) as e:
        raise ConfigError(str(e).strip("'\"")) from e


def _plan_memory(cfg):
    """Refuse a config whose memory plan does not fit ``train.memory_gb`` (before anything starts) and resolve
    ``train.chunk_cells: auto``; returns the (possibly re-shaped) config."""
    from digenrl.control.run_plan import timestep_plan  # (pure: `digenrl check` loads no torch)
    from digenrl.train.memory import MemoryPlanError
    from digenrl.train.memory_check import (check_config, check_generators, resolve_chunk_cells,
                                            trainer_generation_batch)
    from digenrl.validate import refused

    with refused(MemoryPlanError):
        if cfg.train.chunk_cells == "auto":
            cfg = resolve_chunk_cells(cfg, len(timestep_plan(cfg, 0).trained))
        check_config(cfg)
        check_generators(cfg)
        trainer_generation_batch(cfg)
    return cfg


def cmd_train(args) -> int:
    from digenrl.runtime.run_dir import discard_unstarted, lock_run_dir, run_start, unlock_run_dir
    from digenrl.train.interrupt import StopRequest
    from digenrl.validate import eval_warnings, validate_run

    cfg = _load(args)
    cfg = _plan_memory(cfg)  # a config that will not fit its GPUs: exit 2 first; chunk_cells=auto resolved
    validate_run(cfg)  # bad input: exit 2 before the run directory exists or Ray starts
    for warning in eval_warnings(cfg):  # the eval reuses the train prompts / fewer prompts than eval.num_prompts
        print(f"digenrl: warning: {warning}", file=sys.stderr, flush=True)
    _print_prediction(cfg)  # runtime.profile: the plan's predicted step time against colocated (warns if slower)
    run_start(cfg, resume=bool(args.resume), overwrite=args.overwrite)  # refused: still nothing written
    made = not Path(cfg.run_dir).exists()  # a run that fails before its first eval removes the dir it made
    lock_run_dir(cfg.run_dir)  # one writer per run_dir, for the whole run: a second one is refused here (exit 2)
    summary = None
    try:
        start = run_start(cfg, resume=bool(args.resume), overwrite=args.overwrite)  # again, under the lock
        from digenrl.control.run_plan import plan_run
        from digenrl.runtime.driver import run_training, uses_ray

        ray = uses_ray(plan_run(cfg), args.ray)
        stop = StopRequest(abandon=ray)  # in-process: the controller's thread is the workers': stop at a step's end
        try:
            with stop.installed():
                summary = run_training(cfg, start, stop, ray=ray)
        except Exception as e:
            code = _stopped(cfg, e)
            if code is None:
                raise
            return code
    finally:
        unlock_run_dir(cfg.run_dir)
        if made and summary is None:
            discard_unstarted(cfg.run_dir)
    stopped = summary.get("guard_stop")
    print(f"eval reward {summary['eval_reward_initial']:.3f} -> {summary['eval_reward_final']:.3f} "
          f"in {summary.get('steps_done', summary['steps'])} steps, {summary['wall_s']:.1f} s "
          f"({summary['samples_per_s']:.1f} samples/s); outputs in {cfg.run_dir}")
    if stopped:  # eval.guard_action=stop (observe.hacking_guard): a finished run's outputs, its own exit code
        from digenrl.observe.hacking_guard import EXIT_GUARD

        print(f"digenrl: run stopped by eval.guard after step {stopped['step']} of {cfg.steps}: guard/{stopped['guard']} "
              f"fell {stopped['first']:.4g} -> {stopped['value']:.4g} while the eval reward rose "
              f"{stopped['eval_reward_initial']:.4g} -> {stopped['eval_reward']:.4g}; continue anyway with: "
              f"digenrl train --resume {cfg.run_dir} eval.guard_action=warn", file=sys.stderr)
        return EXIT_GUARD
    return 0


def _stopped(cfg, e: Exception) -> int | None:
    """The exit code of a run that stopped on ``e`` after it started, having written ``failure.json`` where there is
    one and said in one line how to go on; None for an error that is none of these (re-raised):

    * a stop signal (first, whatever error it came back as): ``EXIT_INTERRUPTED``;
    * a non-finite value before it reached the weights (``RunHalted``): nothing committed after it, exit 2;
    * a ``WorkerFailure`` (names the worker and the step; the checkpoints stay valid): its log's tail, exit 1;
    * an ``OSError`` (disk full, a read-only or failing file system): exit 74. Writes are atomic, so every
      checkpoint on disk is whole and the newest resumes."""
    from digenrl.faults import RunHalted
    from digenrl.runtime.errors import WorkerFailure
    from digenrl.runtime.run_outputs import FailureRecord, resume_command, write_failure
    from digenrl.train.checkpoint import latest_checkpoint
    from digenrl.train.interrupt import EXIT_INTERRUPTED, as_interrupted

    signal = as_interrupted(e)
    if signal is None and not isinstance(e, (RunHalted, WorkerFailure, OSError)):
        return None
    run_dir = Path(cfg.run_dir)
    ckpt = (signal.checkpoint if signal is not None else None) or latest_checkpoint(run_dir)
    cmd = resume_command(run_dir)
    start_over = "no resumable checkpoint was written; fix the cause and start the run again"
    if signal is not None:
        write_failure(run_dir, FailureRecord("interrupted", str(signal), step=signal.step, signal=signal.signal_name,
                                             checkpoint=ckpt, resume=cmd if ckpt else None))
        print(f"digenrl: stopped by {signal.signal_name}; resume with: {cmd}" if ckpt is not None else
              f"digenrl: stopped by {signal.signal_name} before any resumable checkpoint; start over with: "
              f"digenrl train --overwrite run_dir={run_dir} ...", file=sys.stderr)
        return EXIT_INTERRUPTED
    if isinstance(e, RunHalted):
        write_failure(run_dir, FailureRecord("halted", str(e), checkpoint=ckpt))
        kept = f"the last good checkpoint {ckpt} is kept" if ckpt else "no resumable checkpoint was written before it"
        return _fail(f"run stopped: {e}; nothing was committed or saved after it, {kept}")
    if isinstance(e, WorkerFailure):
        hint = f"resume with: digenrl train --resume {cfg.run_dir}" if ckpt is not None else start_over
        print(f"digenrl: run failed: {e}\n{hint}", file=sys.stderr)
        _print_worker_log(cfg, e.worker)
        return 1
    what = f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")
    try:
        write_failure(run_dir, FailureRecord("io", what, errno=e.errno, checkpoint=ckpt, resume=cmd if ckpt else None))
    except OSError:
        pass  # the disk is still full: the line below says it all
    go_on = f"free space (or fix the file system) and resume with: {cmd}" if ckpt else start_over
    print(f"digenrl: error: run stopped writing its outputs: {what}; {go_on}", file=sys.stderr)
    return EXIT_IO


def _print_worker_log(cfg, worker: str | None, lines: int = 20) -> None:
    """The last lines of the failing worker's log (``run_dir/logs/<worker>.log``, ``runtime.worker_base``)."""
    if not worker:
        return
    from digenrl.runtime.cluster import worker_log_dir
    from digenrl.runtime.worker_base import log_tail

    path = worker_log_dir(cfg) / f"{worker}.log"
    tail = log_tail(path, lines)
    if tail:
        print(f"--- last {len(tail)} lines of {worker}'s log ({path}) ---", file=sys.stderr)
        print("\n".join(tail), file=sys.stderr)
        print("---", file=sys.stderr)
    elif path.parent.is_dir() and not path.exists():  # a Ray run (its driver made logs/), the file elsewhere
        print(f"({worker}'s log is not on this machine: on a cluster whose nodes do not share run_dir it stays on "
              f"the worker's node, at {path})", file=sys.stderr)


def _print_prediction(cfg) -> None:
    """A disaggregated run with ``runtime.profile``: its predicted steady step time and colocated's on the same
    workers (``sim.prediction``), on stdout; a warning on stderr when colocated is predicted faster."""
    from digenrl.sim.prediction import predict, report

    line, warn = report(cfg, predict(cfg))
    if line:
        print(line, flush=True)
    if warn:
        print(warn, file=sys.stderr, flush=True)


def cmd_pretrain(args) -> int:
    import torch

    torch.set_num_threads(1)  # the committed assets were made single-threaded: same seed -> same tensors
    if args.out and not Path(args.out).parent.is_dir():
        return _fail(f"--out: directory {str(Path(args.out).parent)!r} does not exist")
    if args.what == "classifier":
        from digenrl.rewards.digits import ASSET, train_classifier

        kwargs = {"epochs": args.iters} if args.iters else {}
        train_classifier(seed=args.seed, out=args.out or ASSET, **kwargs)
    else:
        from digenrl.tasks.pretrain_digits import pretrain_base
        from digenrl.models.tiny_dit import DEFAULT_BASE

        kwargs = {"iters": args.iters} if args.iters else {}
        pretrain_base(seed=args.seed, out=args.out or DEFAULT_BASE, **kwargs)
    return 0


def _trained_context(args, cfg):
    """The run context with ``--checkpoint`` (a run dir, checkpoint, exported LoRA or transformer) loaded."""
    from digenrl.export import ArtifactError, apply_checkpoint
    from digenrl.validate import refused

    ctx = _context(cfg)
    loaded = None
    if args.checkpoint:
        with refused(ArtifactError):
            loaded = apply_checkpoint(ctx.policy, args.checkpoint)
    elif args.config and (Path(args.config).parent / "checkpoint.safetensors").is_file():
        print(f"digenrl: note: scoring the base model {cfg.model.path or '(built-in)'}; pass --checkpoint "
              f"{Path(args.config).parent} to score the run's trained weights", file=sys.stderr)  # fmt: skip
    return ctx, loaded


def _sampling_batch(cfg) -> int:
    """``digenrl eval`` / ``sample``'s batch: ``memory_check.sampling_batch`` (refused before the model loads when
    not one sample fits ``train.memory_gb``), else ``SAMPLE_BATCH``."""
    from digenrl.train.memory import MemoryPlanError
    from digenrl.train.memory_check import SAMPLE_BATCH, sampling_batch
    from digenrl.validate import refused

    with refused(MemoryPlanError):
        return sampling_batch(cfg) or SAMPLE_BATCH


def cmd_eval(args) -> int:
    import json

    from digenrl.train.evaluate import evaluate

    cfg = _load(args)
    batch = _sampling_batch(cfg)
    ctx, loaded = _trained_context(args, cfg)
    prompts = ctx.task.eval_prompts(cfg.eval.num_prompts)
    r, _ = evaluate(ctx.policy, prompts, ctx.reward, ctx.sampler, run_seed=cfg.seed,
                    num_steps=cfg.sampler.eval_num_steps, max_batch=batch)
    print(json.dumps({"eval_reward": r, "prompts": len(prompts), "model": cfg.model.kind, "path": cfg.model.path,
                      "checkpoint": loaded}))  # fmt: skip
    return 0


def cmd_sample(args) -> int:
    from digenrl.observe.plots import sample_grid
    from digenrl.train.evaluate import evaluate

    cfg = _load(args)
    out = Path(args.out)
    if not out.parent.is_dir():
        return _fail(f"--out: directory {str(out.parent)!r} does not exist")
    size = _sampling_batch(cfg)
    ctx, _ = _trained_context(args, cfg)
    prompts = ctx.task.eval_prompts(args.num)
    _, batch = evaluate(ctx.policy, prompts, ctx.reward, ctx.sampler, run_seed=args.seed,
                        num_steps=cfg.sampler.eval_num_steps, max_batch=size)
    sample_grid(batch.images, [p.text for p in batch.prompts], out, scores=batch.rewards.tolist())
    print(f"wrote {out} (mean reward {float(batch.rewards.mean()):.3f})")
    return 0


FORWARDED = {
    "check": ("digenrl.check_cli:main", "validate a config and print its resolved form, memory plan and split (no Ray, no GPU)"),
    "simulate": ("digenrl.sim.cli:main", "simulate the schedule of a model on a GPU testbed (virtual time)"),
    "reward-serve": ("digenrl.rewards.service:main", "serve registered rewards over HTTP"),
    "cache-prompts": ("digenrl.tasks.cache_prompts_cli:main", "encode the task's prompts into model.prompt_cache_dir"),
    "export": ("digenrl.export:main", "export a run's trained weights as a diffusers LoRA or transformer"),
    "profile": ("digenrl.runtime.calibrate_cli:main", "measure a cost profile of this machine for simulate --profile"),
    "plan": ("digenrl.sim.plan_cli:main", "search the fastest plan of a config and write it as a runnable config"),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="digenrl", description="Disaggregated RL post-training for flow-matching generators.")
    sub = p.add_subparsers(dest="command", required=True)

    def with_config(sp):
        from digenrl.cli_args import add_overrides

        sp.add_argument("--config", "-c", default=None, help="YAML config (default: the built-in CPU demo)")
        return add_overrides(sp)  # KEY=VALUE positionals and --set KEY=VALUE, anywhere among the flags

    t = with_config(sub.add_parser("train", help="RL-train a policy (default: the built-in digits demo on CPU)"))
    t.add_argument("--ray", action="store_true", help="use the Ray runtime even for colocated single-worker runs")
    t.add_argument("--resume", metavar="RUN_DIR", default=None,
                   help="continue the run in RUN_DIR from its newest checkpoint (its config.yaml + overrides)")
    t.add_argument("--overwrite", action="store_true", help="replace a previous run in run_dir (deletes its outputs)")
    t.set_defaults(fn=cmd_train)
    pt = sub.add_parser("pretrain", help="make the demo's classifier or base generator (reproducible from --seed)")
    pt.add_argument("what", choices=["classifier", "base"], help="the demo's digit classifier or its base generator")
    pt.add_argument("--seed", type=int, default=0, help="seed of the weights and the data (default 0)")
    pt.add_argument("--iters", type=int, default=None, help="optimizer iterations (base) or epochs (classifier)")
    pt.add_argument("--out", default=None, help="output safetensors (default: the packaged asset)")
    pt.set_defaults(fn=cmd_pretrain)
    ckpt_help = "trained weights on top of the config's base model: a run dir, checkpoint, exported LoRA or transformer"
    e = with_config(sub.add_parser("eval", help="ODE-sample the eval prompts and report the mean reward"))
    e.add_argument("--checkpoint", default=None, help=ckpt_help)
    e.set_defaults(fn=cmd_eval)
    s = with_config(sub.add_parser("sample", help="write a grid of samples of the eval prompts"))
    s.add_argument("--checkpoint", default=None, help=ckpt_help)
    s.add_argument("--out", default="samples.png", help="PNG to write (default samples.png)")
    s.add_argument("--num", type=int, default=16, help="eval prompts drawn (default 16)")
    s.add_argument("--seed", type=int, default=0, help="noise seed of the samples (default 0)")
    s.set_defaults(fn=cmd_sample)
    for name, (_, help_) in FORWARDED.items():
        sub.add_parser(name, help=help_, add_help=False)
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse a subcommand's arguments; overrides may come before, between or after the flags."""
    from digenrl.cli_args import merge_overrides

    p = build_parser()
    args, extra = p.parse_known_args(argv)
    if not hasattr(args, "overrides"):  # pretrain: no config, no overrides
        if extra:
            p.error(f"unrecognized arguments: {' '.join(extra)}")
        return args
    sub = p._subparsers._group_actions[0].choices[args.command]
    return merge_overrides(sub, args, extra)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in FORWARDED:  # the subcommand's own main parses the rest
        import importlib

        module, fn = FORWARDED[argv[0]][0].split(":")
        return int(getattr(importlib.import_module(module), fn)(argv[1:]) or 0)
    args = parse_args(argv)
    from digenrl.config import ConfigError
    from digenrl.faults import RunHalted

    try:
        return args.fn(args)
    except (ConfigError, RunHalted) as e:  # RunHalted in eval / sample: a reward returned a non-finite score
        return _fail(str(e))


if __name__ == "__main__":
    sys.exit(main())
