"""Does ``digenrl plan`` predict real step times? Predicted vs measured steady step time of three plans on CPU.

Setup: the workload and TinyDiT of ``benchmarks/pipeline_cpu.py`` (P = 8 prompts x G = 8 generations, T = 10,
S = 4 trained timesteps, 1 thread per worker), ``gap_tsp_tag`` on 2 workers (1 generator + 1 trainer rank:
this machine has 2 cores). A cost profile is measured once on live workers of that layout with every fragment
size (divisors of G) and chunk size the sweep can use; ``sim.planner.search`` probes every fragment size x
chunk shape (48 candidates) with it. Three plans are then run for real with the Ray runtime
(``run_training``, the profile also feeding BTS): the plan's choice, the median candidate and the slowest
candidate (by predicted time), each ``--rounds`` times, interleaved. For each: the predicted steady step time of the
run's own length (simulated with the same plan and profile), the measured one (publish of the last step - publish
of the first) / (K - 1), mean over the rounds, the prediction from the ``profile_observed.json`` the chosen plan's
first run wrote (its op costs laid over the calibration's curves: how well a run's observed costs plan other
fragment and chunk sizes), and the prediction from the runs' own op costs (``pipeline_cpu.trace_profile``: the
schedule model's share of the error; the rest is the profile's).

The machine is shared with other jobs: its speed drifts by 15-25% over minutes, and the profile, measured once
before the runs as a user of ``digenrl plan`` would, carries that drift into every prediction.

Run: ``python benchmarks/plan_validation.py [--steps 6] [--rounds 2] [--repeats 8] [--keep DIR]
[--out benchmarks/results/plan_validation.json]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from pipeline_cpu import MODEL, WORKLOAD, sim_steady_step, trace_profile  # noqa: E402


def measure(cfg, work: Path, repeats: int) -> Path:
    from digenrl.control.run_plan import plan_run
    from digenrl.runtime.calibrate import calibrate
    from digenrl.runtime.cluster import start_pools

    run = plan_run(cfg)
    G, S = run.plan.generations, run.trained_timesteps
    cells = sorted({cg * cs for cg in range(1, G + 1) if G % cg == 0 for cs in range(1, S + 1) if S % cs == 0})
    pools = start_pools(run)
    try:
        data = calibrate(run, pools, repeats=repeats, gen_sizes=[f for f in range(1, G + 1) if G % f == 0],
                         cell_sizes=cells, trainer_generation=True)
    finally:
        pools.kill()
    path = work / "profile.json"
    path.write_text(json.dumps(data, indent=1))
    return path


def _columns(res: dict) -> tuple[bool, bool]:
    """Whether the results have the observed-profile and the own-cost predictions (older files lack them)."""
    return (all("observed_step_time_s" in r for r in res["rows"]),
            all("own_costs_step_time_s" in r for r in res["rows"]))


def table_cells(res: dict) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the results table (docs/benchmarks.md's and the simulation doc's)."""
    names = {"chosen": "chosen", "median": "median candidate", "slowest": "slowest candidate"}
    obs, own = _columns(res)
    head = (["plan", "candidate", "predicted (s)", "measured (s)", "error"]
            + (["from the chosen plan's profile_observed (s)"] if obs else []) + (["own costs (s)"] if own else []))
    body = [[names.get(r["plan"], r["plan"]), r["label"], f"{r['predicted_step_time_s']:.2f}",
             f"{r['measured_step_time_s']:.2f}", f"{r['error']:+.0%}"]
            + ([f"{r['observed_step_time_s']:.2f} ({r['observed_error']:+.0%})"] if obs else [])
            + ([f"{r['own_costs_step_time_s']:.2f} ({r['own_costs_error']:+.0%})"] if own else [])
            for r in res["rows"]]
    return head, body


def markdown_table(res: dict) -> str:
    """The table and summary line of a results file (docs/benchmarks.md) (no runs)."""
    head, body = table_cells(res)
    obs, own = _columns(res)
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(b) + " |" for b in body]
    errs = [r["error"] for r in res["rows"]]
    line = (f"The chosen plan is {res['chosen_vs_best_measured']:.0%} slower than the fastest measured; the "
            f"predictions from the profile are {min(errs):+.0%} to {max(errs):+.0%} off")
    if obs:
        line += (", those from the chosen plan's first run's profile_observed.json "
                 f"{min(r['observed_error'] for r in res['rows']):+.0%} to {max(r['observed_error'] for r in res['rows']):+.0%}")
    if own:
        line += (", those from the runs' own op costs "
                 f"{min(r['own_costs_error'] for r in res['rows']):+.0%} to {max(r['own_costs_error'] for r in res['rows']):+.0%}")
    return "\n".join(out + ["", line + f" ({res.get('rounds', 1)} interleaved runs per plan, means)."])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2, help="runs per plan, interleaved; measured = their mean")
    ap.add_argument("--repeats", type=int, default=8, help="timed repeats per op of the profile")
    ap.add_argument("--keep", default=None, help="keep the run directories here")
    ap.add_argument("--out", default=None)
    ap.add_argument("--table", default=None, metavar="RESULTS", help="print the table of a results file (docs/benchmarks.md) and exit")
    args = ap.parse_args(argv)
    if args.table:
        print(markdown_table(json.loads(Path(args.table).read_text())))
        return 0
    torch.set_num_threads(1)
    os.environ.setdefault("RAY_worker_niceness", "0")
    import ray

    from digenrl.config import load_config
    from digenrl.control.profile import ProfileCost, load_profile
    from digenrl.control.run_plan import plan_run
    from digenrl.models.tiny_dit import TinyDiTConfig, TinyDiTPolicy
    from digenrl.runtime.driver import run_training
    from digenrl.control.profile import profile_pools
    from digenrl.sim.config_source import ConfigSource
    from digenrl.sim.planner import search

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(args.keep or tmp)
            work.mkdir(parents=True, exist_ok=True)
            torch.manual_seed(0)
            model = work / "model.safetensors"
            TinyDiTPolicy(TinyDiTConfig(**MODEL)).save(model)
            cfg = load_config(None, [f"model.path={model}", f"steps={args.steps}", *WORKLOAD,
                                     "runtime.mode=gap_tsp_tag", "runtime.generators=1", "runtime.trainers=1"])
            prof_path = measure(cfg, work, args.repeats)
            prof = load_profile(prof_path)
            src = ConfigSource(cfg, 2, profile=prof, profile_trainers=profile_pools(prof_path)[1])
            res = search(src, probe_steps=4)
            apply = lambda _cfg, c: src.config_for(c)  # noqa: E731 - the config the planner priced
            ranked = sorted(res.probes, key=lambda p: p.step_time)
            picks = {"chosen": res.best, "median": ranked[len(ranked) // 2], "slowest": ranked[-1]}
            runs: dict[str, list] = {name: [] for name in picks}
            for r in range(args.rounds):  # interleaved: the machine's speed drifts over minutes
                for name, p in picks.items():
                    c = apply(cfg, p.candidate).model_copy(update={"run_dir": str(work / f"{name}_{r}")})
                    c = c.model_copy(update={"runtime": c.runtime.model_copy(update={"profile": str(prof_path)})})
                    plan = replace(plan_run(c).plan, steps=args.steps)
                    s = run_training(c, ray=True)
                    own = sim_steady_step(plan, ProfileCost.from_dict(trace_profile(work / f"{name}_{r}",
                                                                                    plan.sampling_steps)))
                    runs[name].append((s["steady_step_time_s"], own, len(s["audit_violations"])))
                    print(f"{name} round {r + 1}: measured {s['steady_step_time_s']:.3f} s, own costs {own:.3f} s",
                          file=sys.stderr)
            # the chosen plan's first run leaves profile_observed.json: its op costs laid over the calibration's
            # curves; it prices the other candidates too (other fragment and chunk sizes)
            observed = load_profile(work / "chosen_0" / "profile_observed.json")
            for name, p in picks.items():
                plan = replace(plan_run(apply(cfg, p.candidate)).plan, steps=args.steps)
                predicted = sim_steady_step(plan, prof)
                from_observed = sim_steady_step(plan, observed)
                measured = statistics.fmean(m for m, _, _ in runs[name])
                own = statistics.fmean(o for _, o, _ in runs[name])
                row = {"plan": name, "label": p.candidate.label(p.plan), "probe_step_time_s": p.step_time,
                       "predicted_step_time_s": predicted, "measured_step_time_s": measured,
                       "error": predicted / measured - 1.0, "observed_step_time_s": from_observed,
                       "observed_error": from_observed / measured - 1.0, "own_costs_step_time_s": own,
                       "own_costs_error": own / measured - 1.0,
                       "round_measured_s": [m for m, _, _ in runs[name]],
                       "audit_violations": sum(v for _, _, v in runs[name])}
                print(json.dumps(row), file=sys.stderr)
                rows.append(row)
    finally:
        ray.shutdown()
    best_measured = min(r["measured_step_time_s"] for r in rows)
    out = {"machine": "shared 2-core CPU (other jobs running)", "steps": args.steps, "rounds": args.rounds,
           "profile_repeats": args.repeats, "candidates": len(res.probes),
           "rows": rows, "chosen_vs_best_measured": rows[0]["measured_step_time_s"] / best_measured - 1.0}
    print(json.dumps(out, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
