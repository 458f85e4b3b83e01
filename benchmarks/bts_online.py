"""BTS on a machine its profile misjudges: the static profile vs the online refinement (``tuning.bts.online``).

A run plans with a profile measured before it; the machine it meets can differ per kind of work (the CPU
pipeline benchmark's runs are up to 20-36% off the calibration timed just before them, ``pipeline_cpu.json``
``round_errors``). Here the
machine is the preset's cost model times known factors per action kind (``MISJUDGED``), the profile is the
preset's model as it is, and for every (model, testbed) preset and TAG mode (the split the planner picks with
exact costs) the same plan is simulated with:

* ``none`` (k = 0 at every bubble) and ``greedy`` (one fragment per idle trainer rank), which use no costs;
* ``static``: BTS depth 2 planning with the profile throughout (``BTSConfig(online=False)``);
* ``online``: BTS depth 2 refining the profile at every step from the action times it sees (the default);
* ``knowing``: BTS depth 2 given the machine's own costs (the oracle the other two are measured against).

Levels: ``exact`` (the machine's durations as they are) and ``runtime`` (each action also jittered by the
runtime's measured per-op spread, ``op_jitter.json`` ``kinds[*].sigma_fast``, 16 seeds), as in
``bts_quality.py``. Mean step time = makespan / steps over ``--steps`` steps (step 1 is planned with the
profile alone in every policy).

Writes ``benchmarks/results/bts_online.json``: ``rows`` (preset x mode x misjudgement x level x seed x policy),
``summary`` (per misjudgement, level and policy: step time relative to ``knowing``, mean / min / max, and how
often it is more than 0.1% slower) and ``scales`` (the online factors the last step used, per misjudgement,
exact level, against the true factors).

Run: ``python benchmarks/bts_online.py [--steps 8] [--workers 2] [--out PATH]`` (~3 min on 2 shared cores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bts_quality import RESULTS, SEEDS, TIE, jitter_levels, sweep  # noqa: E402

from digenrl.schedule import BTSConfig, Mode, ScaledCost  # noqa: E402

# machine = profile x these factors (action kinds of ``schedule.online_cost``; missing kinds: 1)
MISJUDGED = {
    "generation slower (x1.3), training faster (x0.8)": {"generate/generator": 1.3, "generate/trainer": 1.3,
                                                          "train": 0.8},
    "generation faster (x0.8), training slower (x1.25)": {"generate/generator": 0.8, "generate/trainer": 0.8,
                                                           "train": 1.25},
    "TAG generation on trainers slower (x1.5)": {"generate/trainer": 1.5},
}
POLICIES = ("none", "greedy", "static", "online", "knowing")


def _bts(policy: str) -> BTSConfig:
    if policy in ("none", "greedy"):
        return BTSConfig(policy=policy)
    return BTSConfig(policy="bts", online=policy == "online")


def config_rows(task) -> list[dict]:
    """Every misjudgement, level, seed and policy of one preset and mode (one process)."""
    from digenrl.sim.executor import simulate
    from digenrl.sim.scenario import PresetSource, Scenario, run_mode
    from digenrl.sim.presets import TESTBEDS, model_preset, workload_preset

    model, tb, mode, steps, levels = task
    s = Scenario(model_preset(model), TESTBEDS[tb], replace(workload_preset(model)), TESTBEDS[tb].total, steps=steps)
    chosen = run_mode(s, mode, bts=BTSConfig(policy="bts")).candidate
    profile, plan = PresetSource(s, Mode(mode)).build(chosen)
    plan = replace(plan, steps=steps)
    rows = []
    for name, factors in MISJUDGED.items():
        machine = ScaledCost(profile, factors)
        for lvl, sigma in levels.items():
            for seed in ((0,) if not sigma else SEEDS):
                for pol in POLICIES:
                    res = simulate(plan, machine, profile=machine if pol == "knowing" else profile,
                                   jitter=sigma if sigma else 0.0, seed=seed, bts=_bts(pol), record=False)
                    rows.append({"model": model, "testbed": tb, "mode": mode, "gen_gpus": chosen.split.n_gen,
                                 "misjudged": name, "jitter": lvl, "seed": seed, "policy": pol,
                                 "step_time_s": res.step_time, "tag_fragments_per_step": res.tag_fragments_per_step,
                                 "last_scales": res.stats[-1].cost_scales if pol == "online" else {}})
    return rows


def summarize(rows: list[dict]) -> tuple[dict, dict]:
    key = ("model", "testbed", "mode", "misjudged", "jitter", "seed")
    ref = {tuple(r[k] for k in key): r["step_time_s"] for r in rows if r["policy"] == "knowing"}
    for r in rows:
        r["vs_knowing"] = r["step_time_s"] / ref[tuple(r[k] for k in key)] - 1
    summary = {}
    for name in MISJUDGED:
        for lvl in dict.fromkeys(r["jitter"] for r in rows):
            for pol in POLICIES:
                rel = [r["vs_knowing"] for r in rows if r["misjudged"] == name and r["jitter"] == lvl
                       and r["policy"] == pol]
                summary[f"{name}/{lvl}/{pol}"] = {
                    "misjudged": name, "jitter": lvl, "policy": pol, "runs": len(rel),
                    "mean_vs_knowing": statistics.fmean(rel), "min": min(rel), "max": max(rel),
                    "slower": sum(v > TIE for v in rel)}
    scales = {}
    for name, factors in MISJUDGED.items():
        got = [r["last_scales"] for r in rows if r["misjudged"] == name and r["jitter"] == "exact"
               and r["policy"] == "online"]
        scales[name] = {k: {"true": factors.get(k, 1.0), "online_min": min(g[k] for g in got if k in g),
                            "online_max": max(g[k] for g in got if k in g)}
                        for k in sorted({k for g in got for k in g})}
    return summary, scales


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2, help="processes (one preset x mode each)")
    ap.add_argument("--jitter", default=str(RESULTS / "op_jitter.json"), help="op_jitter.py results")
    ap.add_argument("--out", default=str(RESULTS / "bts_online.json"))
    args = ap.parse_args(argv)
    if args.steps < 2 or args.workers < 1:
        ap.error(f"--steps must be >= 2 and --workers >= 1 (got {args.steps}, {args.workers})")
    jpath = Path(args.jitter)
    if not jpath.is_file():
        ap.error(f"--jitter: no file {jpath} (run benchmarks/op_jitter.py first)")
    levels = {k: v for k, v in jitter_levels(jpath).items() if k in ("exact", "runtime")}
    t0 = time.perf_counter()
    rows = sweep(config_rows, args.steps, levels, args.workers)
    summary, scales = summarize(rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    res = {"steps": args.steps, "policies": list(POLICIES), "misjudged": MISJUDGED, "seeds": list(SEEDS),
           "jitter_levels": levels, "jitter_source": jpath.name, "tie_band": TIE, "online_decay": BTSConfig().online_decay,
           "rows": rows, "summary": summary, "scales": scales}
    out.write_text(json.dumps(res, indent=1))
    for v in summary.values():
        print(f"{v['misjudged'][:40]:40s} {v['jitter']:8s} {v['policy']:8s} mean {v['mean_vs_knowing']:+.2%} "
              f"[{v['min']:+.2%}, {v['max']:+.2%}] slower {v['slower']}/{v['runs']}")
    print(f"wrote {out} [{time.perf_counter() - t0:.0f}s]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
