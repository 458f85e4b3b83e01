"""Does BTS depth change anything? Depth 0 / 2 / 4 on workloads chosen to give the deeper search a chance.

``bts_agreement.py`` / ``bts_quality.py`` found depth 0 deciding like depth 2 on every choice of the planner's
own splits. This sweep looks where a deeper look could matter (issue 37, item 8):

* heterogeneous pools (testbed ``A+C``: L40S and H20, whose generators and trainers run at different paces);
* TCSS (mode ``full``: the generators' next-step fragments change what the tail bubble costs);
* off-optimum splits (the planner's split, and a trainer-heavy one with a quarter of the GPUs generating,
  where many trainer ranks idle while fragments are pending, so there are many bubbles with large m; where the
  two are the same split, one row);
* jittered costs (the per-kind sigma of the Ray runtime's spans, ``op_jitter.json`` ``kinds[*].sigma_fast``;
  8 seeds), BTS refining its profile online from the durations it sees, as the runtime does.

Per configuration: the bubbles of a depth-2 run with exact costs are each decided again by fresh searches of
depth 0, 2 and 4 (empty memo, node budget 100k), giving the share of choices (m = min(idle, pending) > 0) where
depth 0 = depth 2 and depth 2 = depth 4; and the step time (makespan / steps) of a whole run at each depth,
exact and jittered (same seeds for every depth), relative to depth 2 (and the seeds where it is more than 0.1 % slower / faster). ``summary``: the number of
configurations where depth 0 and depth 2 differ in any decision / in step time by more than 0.1 %, and the
mean and extremes of the step-time ratios. Writes ``benchmarks/results/bts_depth.json``; docs/simulation.md
("BTS depth") quotes it.

Run: ``python benchmarks/bts_depth.py [--steps 4] [--seeds 8] [--workers 2] [--out PATH]`` (~10 min on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from digenrl.control.loop import run_loop
from digenrl.control.timeline import Timeline
from digenrl.schedule import BTS, BTSConfig, Scheduler
from digenrl.sim.executor import VirtualExecutor
from digenrl.sim.presets import TESTBEDS, model_preset, workload_preset
from digenrl.sim.scenario import Scenario, make_cost, run_mode, split_options
from digenrl.sim.executor import simulate

from bts_agreement import Recorder  # the scheduler's policy with its snapshots kept

HERE = Path(__file__).parent
MODELS_USED = ("flux", "wan", "hunyuan")
TESTBEDS_USED = ("A", "B", "A+C", "D")
MODES = ("gap_tsp_tag", "full")
DEPTHS = (0, 2, 4)
TIE = 1e-3


def _splits(s: Scenario) -> list:
    """The planner's split (None: searched) and a trainer-heavy one (a quarter of the GPUs generate)."""
    opts = split_options(s)
    heavy = min(opts, key=lambda p: abs(p.n_gen - s.gpus / 4))
    return [None, heavy]


def one_config(model: str, tb: str, mode: str, which: int, steps: int, sigma: dict, seeds: int) -> dict:
    s = Scenario(model_preset(model), TESTBEDS[tb], workload_preset(model), TESTBEDS[tb].total, steps=steps)
    split = _splits(s)[which]
    bts = BTSConfig(policy="bts")
    run = run_mode(s, mode, split=split, bts=bts) if split else run_mode(s, mode, bts=bts)
    cost = make_cost(s, run.candidate, False)
    sched = Scheduler(run.plan, cost, bts)
    rec = sched.bts = Recorder(sched.bts)
    run_loop(sched, VirtualExecutor(run.plan, cost), Timeline(run.plan))
    ks: dict[int, list[int]] = {d: [] for d in DEPTHS}
    for snap in rec.snaps:
        if min(len(snap.idle), len(snap.pending)) == 0:
            continue
        for d in DEPTHS:
            ks[d].append(BTS(run.plan, cost, BTSConfig(depth=d, budget_nodes=100_000)).decide(snap).k)
    n = len(ks[0])
    times = {}
    for d in DEPTHS:
        cfg = BTSConfig(policy="bts", depth=d)
        exact = simulate(run.plan, cost, bts=cfg).step_time
        jit = [simulate(run.plan, cost, jitter=sigma, seed=k, bts=cfg).step_time for k in range(1, seeds + 1)]
        times[d] = {"exact": exact, "jitter": jit}
    rel = {d: {"exact": times[d]["exact"] / times[2]["exact"] - 1.0,
               "jitter_mean": statistics.fmean(a / b - 1.0 for a, b in zip(times[d]["jitter"], times[2]["jitter"])),
               "jitter_slower_seeds": sum(a > b * (1 + TIE) for a, b in zip(times[d]["jitter"], times[2]["jitter"])),
               "jitter_faster_seeds": sum(a < b * (1 - TIE) for a, b in zip(times[d]["jitter"], times[2]["jitter"]))}
           for d in DEPTHS}
    return {"model": model, "testbed": tb, "mode": mode, "split": "planner" if which == 0 else "trainer_heavy",
            "gen_gpus": run.n_gen, "train_gpus": run.split.n_train, "bubbles": len(rec.snaps), "choices": n,
            "d0_ne_d2": sum(a != b for a, b in zip(ks[0], ks[2])),
            "d2_ne_d4": sum(a != b for a, b in zip(ks[2], ks[4])),
            "mean_k": {f"d{d}": statistics.fmean(ks[d]) if n else 0.0 for d in DEPTHS},
            "step_time_s": {f"d{d}": times[d]["exact"] for d in DEPTHS},
            "rel_to_d2": {f"d{d}": rel[d] for d in DEPTHS}}


def _job(args):
    return one_config(*args)


def summarize(rows: list[dict]) -> dict:
    out = {"configs": len(rows), "choices": sum(r["choices"] for r in rows)}
    for d in ("d0", "d4"):
        key = "d0_ne_d2" if d == "d0" else "d2_ne_d4"
        ex = [r["rel_to_d2"][d]["exact"] for r in rows]
        ji = [r["rel_to_d2"][d]["jitter_mean"] for r in rows]
        out[d] = {"configs_with_a_different_decision": sum(r[key] > 0 for r in rows),
                  "different_decisions": sum(r[key] for r in rows),
                  "exact_slower": sum(x > TIE for x in ex), "exact_faster": sum(x < -TIE for x in ex),
                  "exact_mean": statistics.fmean(ex), "exact_min": min(ex), "exact_max": max(ex),
                  "jitter_slower": sum(x > TIE for x in ji), "jitter_faster": sum(x < -TIE for x in ji),
                  "jitter_mean": statistics.fmean(ji), "jitter_min": min(ji), "jitter_max": max(ji)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--jitter", default=str(HERE / "results" / "op_jitter.json"))
    ap.add_argument("--out", default=str(HERE / "results" / "bts_depth.json"))
    args = ap.parse_args(argv)
    for name in ("steps", "seeds", "workers"):
        if getattr(args, name) < 1:
            ap.error(f"--{name}: must be >= 1 (got {getattr(args, name)})")
    jpath = Path(args.jitter)
    if not jpath.is_file():
        ap.error(f"--jitter: no such file {jpath} (run benchmarks/op_jitter.py first)")
    sigma = {k: v["sigma_fast"] for k, v in json.loads(jpath.read_text())["kinds"].items()}
    jobs = [(m, tb, mode, which, args.steps, sigma, args.seeds)
            for m in MODELS_USED for tb in TESTBEDS_USED for mode in MODES for which in (0, 1)]
    rows, t0 = [], time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        for i, r in enumerate(pool.map(_job, jobs), 1):
            rows.append(r)
            print(f"[{i}/{len(jobs)} {time.perf_counter() - t0:.0f}s] {r['model']} {r['testbed']} {r['mode']} "
                  f"{r['split']} ({r['gen_gpus']}g/{r['train_gpus']}t): {r['choices']} choices, d0!=d2 "
                  f"{r['d0_ne_d2']}, d2!=d4 {r['d2_ne_d4']}, d0/d2 step {r['rel_to_d2']['d0']['exact']:+.2%} exact, "
                  f"{r['rel_to_d2']['d0']['jitter_mean']:+.2%} jittered", flush=True)
    seen, unique = set(), []
    for r in rows:  # a trainer-heavy split that is the planner's own is one configuration, not two
        key = (r["model"], r["testbed"], r["mode"], r["gen_gpus"], r["train_gpus"])
        if key not in seen:
            seen.add(key)
            unique.append(r)
    rows = unique
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = summarize(rows)
    out.write_text(json.dumps({"steps": args.steps, "seeds": args.seeds, "jitter": str(jpath.name),
                               "rows": rows, "summary": summary}, indent=1))
    print(json.dumps(summary, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
