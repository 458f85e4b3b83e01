"""``digenrl plan``: search the fastest plan of a config's mode and write it as a config ``digenrl train`` runs.

    digenrl plan --config FILE|default (--profile p.json | --testbed X [--gpus N]) --out plan.yaml
                 [--set key=value ...] [--probe-steps 4] [--json]

Searches the config's mode on the workers (``--gpus``, default the config's generators + trainers) with the one
planner of ``digenrl simulate`` (``sim.planner.search`` over ``sim.config_source.ConfigSource``): the generator/trainer
split, fragment size, (``full``) stale cap, and on ``--testbed`` the shard groups, TAG inference copy, gang width and
publish path, every candidate priced as the config ``digenrl train`` would run (its memory plan, ``plan_run``, the
planner's chunk rule); then (``full`` with a joined publish) the stale hold on the chosen plan. It prints the best
plan and its robustness (skewed +-20 % op costs, neighbouring splits), and writes the input config with those keys
set (``train.chunk_generations / chunk_timesteps`` explicit, ``train.chunk_cells`` cleared; on ``--testbed``,
``train.memory_gb`` = the GPU's memory). The written file is loaded back and its ``plan_run`` plan checked
against the priced one before it replaces ``--out``. Bad input exits with code 2 naming the option or key, and
nothing is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from ..cli_args import add_overrides, parse_with_overrides
from .cli import CliError, at_least, cost_source


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="digenrl plan", description="Search the fastest plan of a config's mode (generator/trainer split, fragment size, chunk shape, stale cap, publish path) and write it as a config that digenrl train runs.")
    ap.add_argument("--config", required=True, help="run config YAML, or 'default' for the built-in demo")
    ap.add_argument("--profile", default=None, help="measured cost profile JSON (digenrl profile)")
    ap.add_argument("--testbed", default=None, help="roofline GPU testbed: A | B | C | A+C")
    ap.add_argument("--gpus", type=int, default=None, help="workers to split (default: the config's pools)")
    ap.add_argument("--out", required=True, help="config YAML to write with the chosen plan")
    ap.add_argument("--probe-steps", type=int, default=4, help="steps per probe (>= 4; default 4; a full-mode probe runs at least 8)")
    ap.add_argument("--exhaustive", type=int, default=64,
                    help="per split, probe every combination when there are at most this many (default 64)")
    ap.add_argument("--descend-splits", type=int, default=3,
                    help="beyond --exhaustive: the splits (best at the config's own values) that get the coordinate "
                         "descent (default 3)")
    ap.add_argument("--no-prune", action="store_true",
                    help="simulate every candidate, also those whose step-time floor shows they cannot win (the same "
                         "plan and report, more probes; sim.plan_bound)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    return add_overrides(ap)  # config overrides: --set KEY=VALUE (repeatable) or KEY=VALUE, e.g. runtime.mode=full


def _workers(cfg, gpus: int | None) -> int:
    from .from_config import pools_for

    n = sum(pools_for(cfg, None)) if gpus is None else gpus  # (a sequence-parallel generator counts its GPUs)
    if n < (1 if cfg.runtime.mode == "colocated" else 2):
        raise CliError(f"--gpus: {n} workers cannot hold a generator and a trainer pool")
    return n


def plan_from_args(args):
    from ..config import ConfigError, load_config
    from .config_source import ConfigSource, colocated_source
    from .planner import PlanSearchError, check_probe_steps, search
    from .robustness import robustness

    kw, source = cost_source(args)
    check_probe_steps(args.probe_steps)
    for opt in ("exhaustive", "descend_splits"):
        at_least(args, opt, 1)
    out = Path(args.out)
    if not out.parent.is_dir():
        raise CliError(f"--out: directory {str(out.parent)!r} does not exist")
    config = None if args.config == "default" else args.config
    cfg = load_config(config, args.sets)
    workers = _workers(cfg, args.gpus)
    opts = {"probe_steps": args.probe_steps, "exhaustive": args.exhaustive, "descend_splits": args.descend_splits,
            "prune": not args.no_prune}
    with _progress(args) as tick:
        src = ConfigSource(cfg, workers, **kw)
        res = search(src, progress=tick(cfg.runtime.mode), **opts)
        res.config = src.config_for(res.best.candidate)
        res.robustness = robustness(res, args.probe_steps, src.bts)
        res.colocated, res.colocated_refused = None, None
        if cfg.runtime.mode != "colocated":  # the baseline on the same workers, planned the same way
            try:
                res.colocated = search(colocated_source(cfg, workers, **kw), progress=tick("colocated"), **opts).best
            except (PlanSearchError, ConfigError, ValueError) as e:
                res.colocated_refused = str(e)
    return cfg, res, source


@contextmanager
def _progress(args):
    """A live line on stderr while the search probes (rich; silent with --json or when stderr is no tty)."""
    if args.json or not sys.stderr.isatty():
        yield lambda mode: None
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), transient=True,
                  console=Console(file=sys.stderr)) as bar:
        def tick(mode: str):
            task = bar.add_task(f"planning {mode}")

            def update(n: int, split: str, best: float, skipped: int = 0) -> None:
                bar.update(task, description=f"planning {mode}: {n} probes, {skipped} skipped by their floor, "
                                             f"split {split}, best {best:.4g} s/step")
            return update
        yield tick


def report_of(res, source: str, out: str) -> dict:
    c, rc = res.best.candidate, res.config
    return {"mode": res.mode.value, "workers": res.workers, "source": source, "out": out,
            "best": {"generators": c.split.n_gen, "trainers": c.split.n_train, "fragment_size": c.fragment_size,
                     "chunk": [rc.train.chunk_generations, rc.train.chunk_timesteps],
                     "max_stale_fraction": c.max_stale_fraction, "publish": rc.runtime.publish,
                     "stale_hold": rc.tuning.stale_hold, "shard_groups": rc.train.shard_groups,
                     "tag_inference_copy": rc.tuning.tag_inference_copy, "gang_groups": rc.tuning.gang_groups,
                     "sequence_parallel": c.sequence_parallel,
                     "generator_sequence_parallel": c.generator_sequence_parallel,
                     "step_time_s": res.best.step_time, "label": c.label(res.best.plan)},
            "stale_holds_s": {f"{h:g}": t for h, t in res.holds_s.items()},
            "probes": len(res.probes), "pruned": res.pruned, "best_per_split_s": res.per_split(),
            "refused": res.refused, "robustness": res.robustness, **_colocated_report(res)}


def _colocated_report(res) -> dict:
    """The colocated baseline planned on the same workers (absent for a colocated plan)."""
    co = res.colocated
    if co is None:
        return {"colocated": {"refused": res.colocated_refused}} if res.colocated_refused else {}
    return {"colocated": {"step_time_s": co.step_time, "label": co.candidate.label(co.plan),
                          "faster": co.step_time < res.best.step_time,
                          "trajectories": co.plan.prompts * co.plan.generations,
                          "fsdp": res.config.train.sharding == "fsdp"}}


def write_plan(res, out: Path, header: str) -> None:
    """Write ``res.config`` to ``out`` after checking that it loads and plans to the priced plan."""
    import yaml

    from ..config import load_config
    from ..control.run_plan import plan_run
    from ..safe_files import atomic_write_with
    from .config_source import _unsharded_colocated

    text = header + yaml.safe_dump(res.config.model_dump(mode="json"), sort_keys=False)

    def write(tmp: Path) -> None:
        tmp.write_text(text)
        back = load_config(tmp)
        priced = replace(res.best.plan, steps=back.steps, sampling_steps=back.sampler.num_steps)  # (probe length;
        if plan_run(_unsharded_colocated(back)).plan != priced:  # MixGRPO-Flash) pragma: no cover - a bug
            raise RuntimeError("digenrl plan: the written config does not plan to the priced plan")
    atomic_write_with(out, write)


def _print(rep: dict) -> None:
    b = rep["best"]
    print(f"{rep['mode']} on {rep['workers']} workers, {rep['source']}: {rep['probes']} probes "
          f"({rep['pruned']} candidates skipped by their step-time floor)")
    print(f"best: {b['label']}: {b['step_time_s']:.4g} s/step (steady)")
    print("best per split: " + ", ".join(f"{k} {v:.4g}" for k, v in rep["best_per_split_s"].items()))
    for k, v in rep["refused"].items():
        print(f"refused {k}: {v}")
    if rep["stale_holds_s"]:
        print(f"stale hold: {b['stale_hold']:g} (" + ", ".join(f"h={k} {v:.4g} s" for k, v in
                                                            rep["stale_holds_s"].items()) + ")")
    r = rep["robustness"]
    print("all op costs " + ", ".join(f"{k}: {v:.4g} s" for k, v in r["uniform"].items()))
    for k, v in r["skewed"].items():
        print(f"{k}: chosen plan {v['chosen_s']:.4g} s; fastest split then {v['best_split']} "
              f"({v['best_split_s']:.4g} s)")
    if r["neighbours"]:
        print("neighbouring splits with the plan's other values: "
              + ", ".join(f"{k} {v:.4g} s" for k, v in r["neighbours"].items()))
    co = rep.get("colocated")
    if co and "step_time_s" in co:
        fsdp = ", FSDP over all of them priced as the idealised bound" if co["fsdp"] else ""
        print(f"colocated on the same {rep['workers']} workers (each samples its share of the step's "
              f"{co['trajectories']} trajectories in one action, then trains its share{fsdp}): {co['label']}: "
              f"{co['step_time_s']:.4g} s/step (steady); the plan is {co['step_time_s'] / b['step_time_s']:.2f}x "
              f"colocated")
        if co["faster"]:
            print(f"WARNING: colocated is predicted faster than this {rep['mode']} plan; consider "
                  f"--set runtime.mode=colocated", file=sys.stderr)
    elif co:
        print(f"colocated on the same workers: refused ({co['refused']})")
    print(f"wrote {rep['out']} (digenrl train --config {rep['out']})")


def main(argv: list[str] | None = None) -> int:
    from ..config import ConfigError
    from ..control.profile import ProfileError
    from .from_config import ConfigSimError
    from .planner import PlanSearchError
    from .presets import PresetError

    args = parse_with_overrides(build_parser(), argv)  # KEY=VALUE positionals as --set
    try:
        cfg, res, source = plan_from_args(args)
    except (CliError, ConfigError, ConfigSimError, PlanSearchError, PresetError, ProfileError) as e:
        print(f"digenrl plan: error: {e}", file=sys.stderr)
        return 2
    rep = report_of(res, source, args.out)
    b = rep["best"]
    header = (f"# written by `digenrl plan` ({source}): {res.mode}, {b['label']}; predicted steady step time "
              f"{b['step_time_s']:.4g} s\n")
    co = rep.get("colocated", {})
    if "step_time_s" in co:
        header += (f"# colocated on the same workers ({co['label']}): predicted {co['step_time_s']:.4g} s"
                   + (" -- FASTER than this plan\n" if co["faster"] else "\n"))
    write_plan(res, Path(args.out), header)
    if args.json:
        print(json.dumps(rep, indent=1))
    else:
        _print(rep)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
