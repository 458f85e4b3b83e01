"""``digenrl plan``: search the fastest plan of a config's mode and write it as a config ``digenrl train`` runs.

    digenrl plan --config FILE|default (--profile p.json | --testbed X [--gpus N]) --out plan.yaml
                 [--set key=value ...] [--probe-steps 4] [--json]

Sweeps every generator/trainer split of the workers (``--gpus``, default the config's generators + trainers),
fragment size, chunk shape and (``full``) stale cap with short virtual-time probes (``sim.plan_search``), once
per shard-group count of a sharded trainer pool (``--testbed``, ``sim.plan_groups``) and then once per publish
path (``--testbed``, ``sim.plan_publish``); then (``full``) the stale hold on the chosen plan. It prints the best
plan and its robustness (skewed +-20 % op costs, neighbouring splits), and writes the input config with
``runtime.generators / trainers / fragment_size / max_stale_fraction / publish / stale_hold`` and
``train.chunk_generations / chunk_timesteps / shard_groups`` set (``train.chunk_cells`` cleared; on ``--testbed``,
``train.memory_gb`` = the GPU's memory). The written file is loaded back and its ``plan_run`` plan checked
against the priced one before it replaces ``--out``. Bad input exits with code 2 naming the option or key, and
nothing is written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path


class PlanCliError(ValueError):
    pass


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="digenrl plan", description="Search the fastest plan of a config's mode (generator/trainer split, fragment size, chunk shape, stale cap, publish path) and write it as a config that digenrl train runs.")
    ap.add_argument("--config", required=True, help="run config YAML, or 'default' for the built-in demo")
    ap.add_argument("--profile", default=None, help="measured cost profile JSON (digenrl profile)")
    ap.add_argument("--testbed", default=None, help="roofline GPU testbed: A | B | C | A+C")
    ap.add_argument("--gpus", type=int, default=None, help="workers to split (default: the config's pools)")
    ap.add_argument("--out", required=True, help="config YAML to write with the chosen plan")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="config override (repeatable), e.g. --set runtime.mode=full")
    ap.add_argument("--probe-steps", type=int, default=4, help="steps per probe (>= 4; default 4)")
    ap.add_argument("--exhaustive", type=int, default=64,
                    help="per split, probe every combination when there are at most this many (default 64)")
    ap.add_argument("--descend-splits", type=int, default=3,
                    help="beyond --exhaustive: the splits (best at the config's own values) that get the coordinate "
                         "descent (default 3)")
    ap.add_argument("--no-prune", action="store_true",
                    help="simulate every candidate, also those whose step-time floor shows they cannot win (the same "
                         "plan and report, more probes; sim.plan_bound)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, the same as --set KEY=VALUE")
    return ap


def _workers(cfg, gpus: int | None) -> int:
    n = cfg.runtime.trainers if cfg.runtime.mode == "colocated" else cfg.runtime.generators + cfg.runtime.trainers
    if gpus is not None:
        n = gpus
    if n < (1 if cfg.runtime.mode == "colocated" else 2):
        raise PlanCliError(f"--gpus: {n} workers cannot hold a generator and a trainer pool")
    return n


def _testbed_costs(cfg, name: str, workers: int, trained: int):
    from .from_config import config_model, config_workload
    from .presets import testbed_preset
    from .roofline import InfeasibleError, RooflineCost

    tb = testbed_preset(name)
    if workers > tb.total:
        raise PlanCliError(f"--gpus: {workers} exceeds testbed {tb.name} ({tb.total} GPUs)")
    model, workload = config_model(cfg), config_workload(cfg, trained)
    train_gpu = tb.gpu2 or tb.gpu

    def cost_of(n_gen: int, n_train: int):
        if tb.heterogeneous and (n_gen > tb.count or n_train > tb.count2):
            return f"testbed {tb.name}: at most {tb.count} generators and {tb.count2} trainers"
        try:
            return RooflineCost(model, workload, tb, n_gen, n_train, colocated=n_gen == 0)
        except InfeasibleError as e:
            return f"--testbed: {e}"

    def fit(c):
        return c.model_copy(update={"train": c.train.model_copy(update={"memory_gb": train_gpu.memory_gb})})

    return cost_of, fit, f"testbed {tb.name} ({tb.description})"


def plan_from_args(args):
    from ..config import ConfigError, load_config
    from ..control.profile import load_profile
    from ..control.run_plan import plan_run
    from .plan_groups import refine_groups
    from .plan_publish import refine
    from .plan_search import PlanSearchError, profile_costs, profile_pools, search

    if (args.profile is None) == (args.testbed is None):
        raise PlanCliError("--profile: give exactly one of --profile (measured costs) or --testbed (roofline)")
    if args.probe_steps < 4:
        raise PlanCliError(f"--probe-steps: must be >= 4 for a stable steady step time (got {args.probe_steps})")
    if args.exhaustive < 1:
        raise PlanCliError(f"--exhaustive: must be >= 1 (got {args.exhaustive})")
    if args.descend_splits < 1:
        raise PlanCliError(f"--descend-splits: must be >= 1 (got {args.descend_splits})")
    out = Path(args.out)
    if not out.parent.is_dir():
        raise PlanCliError(f"--out: directory {str(out.parent)!r} does not exist")
    config = None if args.config == "default" else args.config
    cfg = load_config(config, args.sets)
    workers = _workers(cfg, args.gpus)
    trained = plan_run(cfg).trained_timesteps
    if args.profile is not None:
        prof = load_profile(args.profile)
        cost_of, fit, source = profile_costs(prof, profile_pools(args.profile)[1]), None, f"profile {args.profile}"
    else:
        cost_of, fit, source = _testbed_costs(cfg, args.testbed, workers, trained)
    # the roofline prices every publish path; a profile only the one it was measured with (not searched)
    costs_with = None if args.profile is not None else \
        (lambda c: _testbed_costs(c, args.testbed, workers, trained)[0])
    with _progress(args) as tick:
        def search_with(c, cost_of=None):
            return search(c, workers, cost_of or costs_with(c), probe_steps=args.probe_steps,
                          exhaustive=args.exhaustive, fit=fit,
                          progress=tick(f"{c.runtime.mode}, {c.runtime.publish}, k={c.train.shard_groups}"),
                          descend_splits=args.descend_splits, prune=not args.no_prune)

        res = search_with(cfg, cost_of)
        # the shard-group count first (the publish's cost depends on it), then the publish path and stale hold
        cfg_k, res = refine_groups(cfg, res, search_with=search_with, costs_with=costs_with, fit=fit)
        res = refine(cfg_k, res, search_with=search_with, costs_with=costs_with, fit=fit, probe_steps=args.probe_steps)
        if cfg.runtime.mode != "colocated":  # the baseline on the same workers, planned the same way
            coloc = cfg.model_copy(update={"runtime": cfg.runtime.model_copy(  # (FSDP: the peers' one group)
                update={"mode": "colocated", "generators": 1, "trainers": workers}),
                "train": cfg.train.model_copy(update={"shard_groups": 1})})
            try:
                res.colocated = search(coloc, workers, cost_of, probe_steps=args.probe_steps,
                                       exhaustive=args.exhaustive, fit=fit, progress=tick("colocated"),
                                       robust=False, prune=not args.no_prune).best
            except (PlanSearchError, ConfigError) as e:
                res.colocated_refused = str(e)
    return cfg, res, source


class _progress:
    """A live line on stderr while the search probes (rich; silent with --json or when stderr is no tty)."""

    def __init__(self, args):
        self.on = not args.json and sys.stderr.isatty()
        self.bar = None

    def __enter__(self):
        if self.on:
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                transient=True, console=Console(file=sys.stderr))
            self.bar.start()
        return self.tick

    def tick(self, mode: str):
        if self.bar is None:
            return None
        task = self.bar.add_task(f"planning {mode}")

        def update(n: int, split: str, best: float, skipped: int = 0) -> None:
            self.bar.update(task, description=f"planning {mode}: {n} probes, {skipped} skipped by their floor, "
                                              f"split {split}, best {best:.4g} s/step")
        return update

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False


def report_of(res, source: str, out: str) -> dict:
    per_split: dict[str, float] = {}
    for p in res.probes:
        c = p.candidate
        k = f"{c.n_train} coloc" if c.n_gen == 0 else f"{c.n_gen}+{c.n_train}"
        per_split[k] = min(per_split.get(k, float("inf")), p.step_time)
    c = res.best.candidate
    return {"mode": res.mode, "workers": res.workers, "source": source, "out": out,
            "best": {"generators": c.n_gen, "trainers": c.n_train, "fragment_size": c.fragment_size,
                     "chunk": list(c.chunk), "max_stale_fraction": c.max_stale_fraction,
                     "publish": res.config.runtime.publish, "stale_hold": res.config.runtime.stale_hold,
                     "shard_groups": res.config.train.shard_groups,
                     "step_time_s": res.best.step_time, "label": c.label()},
            "publish": _publish_report(res.publish), "shard_groups": _keyed(res.groups),
            "probes": len(res.probes), "pruned": res.pruned, "best_per_split_s": per_split, "refused": res.refused,
            "robustness": res.robustness, **_colocated_report(res)}


def _publish_report(pub: dict) -> dict:
    """``sim.plan_publish``'s record with JSON keys (holds as strings)."""
    return {k: ({f"{h:g}": t for h, t in v.items()} if k == "holds_s" else v) for k, v in pub.items()}


def _keyed(rec: dict) -> dict:
    """``sim.plan_groups``' record with JSON keys (the k of its maps as strings)."""
    return {k: ({str(g): t for g, t in v.items()} if isinstance(v, dict) else v) for k, v in rec.items()}


def _colocated_report(res) -> dict:
    """The colocated baseline planned on the same workers (absent for a colocated plan)."""
    co = res.colocated
    if co is None:
        return {"colocated": {"refused": res.colocated_refused}} if res.colocated_refused else {}
    return {"colocated": {"step_time_s": co.step_time, "label": co.candidate.label(),
                          "faster": co.step_time < res.best.step_time}}


def write_plan(cfg, res, out: Path, header: str) -> None:
    """Write ``res.config`` to ``out`` after checking that it loads and plans to the priced plan."""
    import yaml

    from ..config import load_config
    from ..control.run_plan import plan_run

    text = header + yaml.safe_dump(res.config.model_dump(mode="json"), sort_keys=False)
    fd, tmp = tempfile.mkstemp(suffix=".yaml", dir=out.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        if plan_run(load_config(tmp)).plan != res.best.plan:  # pragma: no cover - a bug, not bad input
            raise RuntimeError("digenrl plan: the written config does not plan to the priced plan")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _tried(rec: dict, times: dict, prefix: str, what: str) -> str:
    """How one setting was chosen (``sim.plan_setting``): each value's search time and each refusal."""
    how = ("searched: " + ", ".join(f"{prefix}{k} {v:.4g} s" for k, v in times.items())
           ) if rec["searched"] else f"the config's (a profile prices only its measured {what})"
    return how + "".join(f"; {prefix}{k} refused: {why}" for k, why in rec.get("refused", {}).items())


def _print(rep: dict) -> None:
    b = rep["best"]
    print(f"{rep['mode']} on {rep['workers']} workers, {rep['source']}: {rep['probes']} probes "
          f"({rep['pruned']} candidates skipped by their step-time floor)")
    print(f"best: {b['label']}: {b['step_time_s']:.4g} s/step (steady)")
    print("best per split: " + ", ".join(f"{k} {v:.4g}" for k, v in rep["best_per_split_s"].items()))
    for k, v in rep["refused"].items():
        print(f"refused {k}: {v}")
    grp, pub = rep["shard_groups"], rep["publish"]
    if grp:  # (searched first: the publish path's search runs at the chosen k)
        print(f"shard groups: {grp['groups']} ({_tried(grp, grp['times_s'], 'k=', 'pool')})")
    if pub:
        print(f"publish path: {pub['path']} ({_tried(pub, pub['paths_s'], '', 'path')})")
        if pub["holds_s"]:
            print(f"stale hold: {pub['hold']:g} (" + ", ".join(f"h={k} {v:.4g} s" for k, v in pub["holds_s"].items())
                  + ")")
    r = rep["robustness"]
    print("all op costs " + ", ".join(f"{k}: {v:.4g} s" for k, v in r["uniform"].items()))
    for k, v in r["skewed"].items():
        print(f"{k}: chosen plan {v['chosen_s']:.4g} s; fastest split then {v['best_split']} "
              f"({v['best_split_s']:.4g} s)")
    if r["neighbours"]:
        print("neighbouring splits: " + ", ".join(f"{k} {v:.4g} s" for k, v in r["neighbours"].items()))
    co = rep.get("colocated")
    if co and "step_time_s" in co:
        print(f"colocated on the same {rep['workers']} workers: {co['label']}: {co['step_time_s']:.4g} s/step "
              f"(steady); the plan is {co['step_time_s'] / b['step_time_s']:.2f}x colocated")
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
    from .plan_search import PlanSearchError
    from .presets import PresetError

    from digenrl.cli_args import parse_with_overrides

    args = parse_with_overrides(build_parser(), argv)  # KEY=VALUE positionals as --set
    try:
        cfg, res, source = plan_from_args(args)
    except (PlanCliError, ConfigError, ConfigSimError, PlanSearchError, PresetError, ProfileError) as e:
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
    write_plan(cfg, res, Path(args.out), header)
    if args.json:
        print(json.dumps(rep, indent=1))
    else:
        _print(rep)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
