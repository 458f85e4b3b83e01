"""BTS decision quality: search depth 0 vs 2 vs 4 over the simulator presets, exact and jittered costs.

For every (model, testbed) preset and TAG mode (``gap_tsp_tag``, ``full``) the split is fixed to the one the
planner picks with the default BTS (depth 2); then the same plan is simulated with BTS depth 0, 2 and 4, with
exact costs and with log-normal per-op jitter (sigma 0.05, two seeds; an assumed variance: no per-op GPU
variance was measured). Writes ``benchmarks/results/bts_quality.json``: rows {model, testbed, mode, jitter,
seed, depth, step_time_s, tag_fragments_per_step, decisions, budget_hits, search_median_ms, commit_error} and
a summary of each depth's step time relative to depth 2. BTS's search budget is wall-clock (``budget_s``), so
budget hits, and with them the decisions, depend on the machine's load.

Not measured here: a greedy "one fragment per idle rank" rule (the scheduler takes no other decision policy
than BTS through its public interface) and the prediction error against the predicted span (the BTS
statistics keep only the absolute predicted commit time).
Run: ``python benchmarks/bts_quality.py [--steps 8] [--out PATH]`` (~5 min on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

# the simulator drivers, imported in this one place
from digenrl.schedule.bts import BTSConfig
from digenrl.sim.planner import run_mode

from digenrl.sim.planner import Scenario as Setup
from digenrl.sim.presets import MODELS, TESTBEDS, WORKLOADS

PRESETS = [("hunyuan", "A"), ("hunyuan", "B"), ("hunyuan", "C"), ("wan", "B"), ("wan", "C"), ("flux", "A"),
           ("flux", "B"), ("flux", "C")]
DEPTHS = (0, 2, 4)
JITTERS = ((0.0, (0,)), (0.05, (1, 2)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bts_quality.json"))
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error(f"--steps: must be >= 1 (got {args.steps})")
    rows, t0 = [], time.perf_counter()
    for model, tb in PRESETS:
        s = Setup(MODELS[model], TESTBEDS[tb], replace(WORKLOADS[model]), TESTBEDS[tb].total, steps=args.steps)
        for mode in ("gap_tsp_tag", "full"):
            split = run_mode(s, mode, bts=BTSConfig(depth=2)).n_gen
            for jitter, seeds in JITTERS:
                for seed in seeds:
                    for depth in DEPTHS:
                        r = run_mode(s, mode, split, jitter=jitter, seed=seed, bts=BTSConfig(depth=depth)).result
                        b = r.bts or {}
                        rows.append({"model": model, "testbed": tb, "mode": mode, "gen_gpus": split,
                                     "jitter": jitter, "seed": seed, "depth": depth, "step_time_s": r.step_time,
                                     "tag_fragments_per_step": r.tag_fragments_per_step,
                                     "decisions": b.get("decisions", 0), "budget_hits": b.get("budget_hits", 0),
                                     "search_median_ms": 1e3 * b.get("search_median_s", 0.0),
                                     "commit_error": b.get("makespan_rel_error_mean", 0.0)})
            print(f"{model} {tb} {mode} [{time.perf_counter() - t0:.0f}s]", flush=True)
    summary = {}
    for d in DEPTHS:
        rel = []
        for r in rows:
            if r["depth"] != d:
                continue
            ref = next(q for q in rows if q["depth"] == 2 and all(q[k] == r[k] for k in
                                                                 ("model", "testbed", "mode", "jitter", "seed")))
            rel.append(r["step_time_s"] / ref["step_time_s"] - 1)
        mine = [r for r in rows if r["depth"] == d]
        summary[f"depth{d}"] = {"mean_vs_depth2": statistics.fmean(rel), "min": min(rel), "max": max(rel),
                                "identical_share": sum(1 for v in rel if abs(v) < 1e-9) / len(rel),
                                "budget_hits": sum(r["budget_hits"] for r in mine),
                                "decisions": sum(r["decisions"] for r in mine)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"steps": args.steps, "rows": rows, "summary": summary}, indent=1))
    print(json.dumps(summary, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
