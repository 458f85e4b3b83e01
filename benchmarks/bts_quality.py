"""TAG decision quality: the greedy rule vs BTS depth 0 / 2 / 4 (and no TAG) over the simulator presets, with
exact costs and with per-operation jitter whose spread was measured (``benchmarks/op_jitter.py``).

For every (model, testbed) preset and TAG mode (``gap_tsp_tag``, ``full``) the split is the one the planner
picks with the default policy (BTS depth 2); the same plan is then simulated with each policy:

* ``none``: k = 0 at every bubble (= the mode without TAG), for scale;
* ``greedy``: one fragment per idle trainer rank while fragments are pending, k = min(idle, pending);
* ``bts_d0`` / ``bts_d2`` / ``bts_d4``: the search at depth 0, 2, 4 with the default node budget (2000 nodes
  per decision; deterministic, so no result depends on this machine's load);
* ``bts_d2_small_ties``: depth 2 with equal predictions resolved to the smaller k (the former rule);
* ``bts_d2_static``: depth 2 without the online refinement (``BTSConfig(online=False)``: the profile as it is
  for the whole run; every other BTS policy refines it from the action times it sees, as the runtime does).

Jitter levels (an independent log-normal factor exp(N(0, sigma_kind^2)) per action, sigma per action kind;
16 seeds each; BTS starts from the unjittered costs, i.e. the medians, as a measured profile is, and refines
them online from the jittered durations, except ``bts_d2_static``):

* ``exact``: none;
* ``in_process``: the per-op spread of the CPU pipeline workload timed back to back in one process
  (``op_jitter.json`` ``in_process``);
* ``runtime``: the per-op spread of the Ray runtime's spans on this shared 2-core machine, after removing slow
  drift (``op_jitter.json`` ``kinds[*].sigma_fast``; TCSS-curve runs, 200 steps each).

Both are CPU measurements (no GPU here): they bound GPU jitter from above rather than estimate it.

Writes ``benchmarks/results/bts_quality.json``: ``rows`` (one per preset x mode x jitter x seed x policy:
step time = makespan / steps, steady step time = (last commit - first commit) / (steps - 1),
TAG fragments per step, decisions, budget hits, nodes per decision (mean / max), search time, and
the prediction error of each step's first decision against the predicted span, mean |.| and mean signed),
``per_config`` (step time per policy relative to greedy, exact and mean over the jittered seeds) and
``summary`` (per policy and jitter level: mean / min / max relative to greedy, wins / ties / losses with a
0.1 % tie band).

``rechecks``: every configuration and jitter level where depth 2 is slower than greedy on average over the
seeds, simulated again with ``--recheck-seeds`` seeds (default 64): mean relative step time, its standard error,
wins / ties / losses (``--recheck-only`` adds them to an existing results file without re-running the sweep).

Run: ``python benchmarks/bts_quality.py [--steps 6] [--workers 2] [--jitter PATH] [--out PATH]
[--recheck-seeds 64] [--recheck-only]`` (~2 min on 2 shared cores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from digenrl.schedule.bts import BTSConfig
from digenrl.sim.scenario import Scenario, run_mode
from digenrl.sim.presets import TESTBEDS, model_preset, workload_preset

PRESETS = [("hunyuan", "A"), ("hunyuan", "B"), ("hunyuan", "C"), ("wan", "B"), ("wan", "C"), ("flux", "A"),
           ("flux", "B"), ("flux", "C")]
MODES = ("gap_tsp_tag", "full")
POLICIES = {"none": BTSConfig(policy="none"), "greedy": BTSConfig(policy="greedy"),
            "bts_d0": BTSConfig(policy="bts", depth=0), "bts_d2": BTSConfig(policy="bts", depth=2),
            "bts_d4": BTSConfig(policy="bts", depth=4),
            "bts_d2_small_ties": BTSConfig(policy="bts", depth=2, ties_to_larger_k=False),
            "bts_d2_static": BTSConfig(policy="bts", depth=2, online=False)}
SEEDS = tuple(range(1, 17))  # jittered levels; each run takes well under a second of simulation
TIE = 1e-3
RESULTS = Path(__file__).parent / "results"


def jitter_levels(path: Path) -> dict[str, dict[str, float]]:
    j = json.loads(path.read_text())
    levels = {"exact": {}}
    if "in_process" in j:
        levels["in_process"] = {k: v["sigma"] for k, v in j["in_process"]["kinds"].items()}
    if j.get("kinds"):
        levels["runtime"] = {k: v["sigma_fast"] for k, v in j["kinds"].items()}
    return levels


def one_run(s: Scenario, mode: str, split: int, sigma: dict, seed: int, cfg: BTSConfig) -> dict:
    r = run_mode(s, mode, split, jitter=sigma if sigma else 0.0, seed=seed, bts=cfg).result
    b = r.bts or {}
    commits = [st.committed for st in r.stats]
    steady = (commits[-1] - commits[0]) / (len(commits) - 1) if len(commits) > 1 else r.step_time
    return {"step_time_s": r.step_time, "steady_step_s": steady, "tag_fragments_per_step": r.tag_fragments_per_step,
            "decisions": b.get("decisions", 0), "budget_hits": b.get("budget_hits", 0),
            "nodes_per_decision": b.get("nodes_per_decision", 0.0), "nodes_max": b.get("nodes_max", 0),
            "search_median_ms": 1e3 * b.get("search_median_s", 0.0),
            "span_error_mean": b.get("span_rel_error_mean", 0.0), "span_error_bias": b.get("span_rel_bias", 0.0),
            "predictions": b.get("predictions", 0), "commit_error_abs_time": b.get("makespan_rel_error_mean", 0.0)}


def config_rows(task) -> list[dict]:
    """Every jitter level, seed and policy of one preset and mode (one process)."""
    model, tb, mode, steps, levels = task
    s = Scenario(model_preset(model), TESTBEDS[tb], replace(workload_preset(model)), TESTBEDS[tb].total, steps=steps)
    split = run_mode(s, mode, bts=BTSConfig(policy="bts")).n_gen
    rows = []
    for lvl, sigma in levels.items():
        for seed in ((0,) if not sigma else SEEDS):
            for pol, cfg in POLICIES.items():
                rows.append({"model": model, "testbed": tb, "mode": mode, "gen_gpus": split, "jitter": lvl,
                             "seed": seed, "policy": pol, **one_run(s, mode, split, sigma, seed, cfg)})
    return rows


def sweep(fn, steps: int, levels: dict, workers: int) -> list[dict]:
    """``fn((model, testbed, mode, steps, levels))`` for every preset and TAG mode, one per process, its rows
    concatenated in preset order (progress printed)."""
    rows, t0 = [], time.perf_counter()
    tasks = [(model, tb, mode, steps, levels) for model, tb in PRESETS for mode in MODES]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for (model, tb, mode, _, _), got in zip(tasks, pool.map(fn, tasks)):
            rows.extend(got)
            print(f"{model} {tb} {mode} [{time.perf_counter() - t0:.0f}s]", flush=True)
    return rows


def summarize(rows: list[dict], levels: list[str]) -> tuple[list[dict], dict]:
    key = ("model", "testbed", "mode")
    ref = {(r["model"], r["testbed"], r["mode"], r["jitter"], r["seed"]): r
           for r in rows if r["policy"] == "greedy"}
    for r in rows:
        g = ref[(r["model"], r["testbed"], r["mode"], r["jitter"], r["seed"])]
        r["vs_greedy"] = r["step_time_s"] / g["step_time_s"] - 1
        r["steady_vs_greedy"] = r["steady_step_s"] / g["steady_step_s"] - 1
    per_config = []
    for cfg in dict.fromkeys(tuple(r[k] for k in key) for r in rows):
        mine = [r for r in rows if tuple(r[k] for k in key) == cfg]
        entry = {**dict(zip(key, cfg)), "gen_gpus": mine[0]["gen_gpus"]}
        for lvl in levels:
            entry[lvl] = {p: statistics.fmean(r["vs_greedy"] for r in mine if r["jitter"] == lvl and r["policy"] == p)
                          for p in POLICIES}
            entry[lvl + "_steady"] = {p: statistics.fmean(r["steady_vs_greedy"] for r in mine
                                                          if r["jitter"] == lvl and r["policy"] == p) for p in POLICIES}
        entry["greedy_step_s_exact"] = next(r["step_time_s"] for r in mine
                                            if r["jitter"] == "exact" and r["policy"] == "greedy")
        per_config.append(entry)
    summary = {}
    for lvl in levels:
        for p in POLICIES:
            rel = [r["vs_greedy"] for r in rows if r["jitter"] == lvl and r["policy"] == p]
            mine = [r for r in rows if r["jitter"] == lvl and r["policy"] == p]
            spans = [r["span_error_mean"] for r in mine if r["predictions"]]
            steady = [r["steady_vs_greedy"] for r in mine]
            summary[f"{lvl}/{p}"] = {
                "mean_vs_greedy": statistics.fmean(rel), "min": min(rel), "max": max(rel),
                "wins": sum(v < -TIE for v in rel), "ties": sum(abs(v) <= TIE for v in rel),
                "losses": sum(v > TIE for v in rel), "runs": len(rel),
                "steady_mean_vs_greedy": statistics.fmean(steady),
                "steady_wtl": [sum(v < -TIE for v in steady), sum(abs(v) <= TIE for v in steady),
                               sum(v > TIE for v in steady)],
                "tag_fragments_per_step": statistics.fmean(r["tag_fragments_per_step"] for r in mine),
                "budget_hits": sum(r["budget_hits"] for r in mine), "decisions": sum(r["decisions"] for r in mine),
                "nodes_max": max(r["nodes_max"] for r in mine),
                "span_error_mean": statistics.fmean(spans) if spans else None,
                "span_error_max_run": max(spans) if spans else None}
    return per_config, summary


def recheck_one(task) -> dict:
    """Depth 2 vs greedy on one configuration and jitter level over ``seeds`` seeds (mean and its standard error)."""
    model, tb, mode, split, steps, lvl, sigma, seeds = task
    s = Scenario(model_preset(model), TESTBEDS[tb], replace(workload_preset(model)), TESTBEDS[tb].total, steps=steps)
    rel = []
    for seed in range(1, seeds + 1):
        g = one_run(s, mode, split, sigma, seed, POLICIES["greedy"])["step_time_s"]
        rel.append(one_run(s, mode, split, sigma, seed, POLICIES["bts_d2"])["step_time_s"] / g - 1)
    return {"model": model, "testbed": tb, "mode": mode, "jitter": lvl, "seeds": seeds,
            "mean_vs_greedy": statistics.fmean(rel), "sem": statistics.stdev(rel) / len(rel) ** 0.5,
            "wins": sum(v < -TIE for v in rel), "ties": sum(abs(v) <= TIE for v in rel),
            "losses": sum(v > TIE for v in rel)}


def recheck(res: dict, seeds: int, workers: int) -> list[dict]:
    """Every configuration where depth 2 is slower than greedy on average at a jittered level of the sweep
    (few seeds), simulated again with ``seeds`` seeds: is the loss larger than the seed-to-seed spread?"""
    levels = res["jitter_levels"]
    tasks = [(c["model"], c["testbed"], c["mode"], c["gen_gpus"], res["steps"], lvl, levels[lvl], seeds)
             for c in res["per_config"] for lvl in levels if levels[lvl] and c[lvl]["bts_d2"] > res["tie_band"]]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(recheck_one, tasks))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--workers", type=int, default=2, help="processes (one preset x mode each)")
    ap.add_argument("--jitter", default=str(RESULTS / "op_jitter.json"), help="op_jitter.py results")
    ap.add_argument("--out", default=str(RESULTS / "bts_quality.json"))
    ap.add_argument("--recheck-seeds", type=int, default=64,
                    help="seeds for re-simulating the configurations where depth 2 loses to greedy (0: none)")
    ap.add_argument("--recheck-only", action="store_true",
                    help="only add the rechecks to the existing --out file (its sweep is kept)")
    args = ap.parse_args(argv)
    if args.recheck_only:
        out = Path(args.out)
        if not out.is_file():
            ap.error(f"--recheck-only: no results file {out}")
        res = json.loads(out.read_text())
        res["rechecks"] = recheck(res, args.recheck_seeds, args.workers)
        out.write_text(json.dumps(res, indent=1))
        for r in res["rechecks"]:
            print(f"{r['model']} {r['testbed']} {r['mode']} {r['jitter']}: {r['mean_vs_greedy']:+.2%} "
                  f"+- {r['sem']:.2%} over {r['seeds']} seeds (W/T/L {r['wins']}/{r['ties']}/{r['losses']})")
        print(f"wrote {out}")
        return 0
    if args.steps < 1 or args.workers < 1:
        ap.error(f"--steps, --workers: must be >= 1 (got {args.steps}, {args.workers})")
    jpath = Path(args.jitter)
    if not jpath.is_file():
        ap.error(f"--jitter: no file {jpath} (run benchmarks/op_jitter.py first)")
    levels = jitter_levels(jpath)
    t0 = time.perf_counter()
    rows = sweep(config_rows, args.steps, levels, args.workers)
    per_config, summary = summarize(rows, list(levels))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    res = {"steps": args.steps, "policies": list(POLICIES), "seeds": list(SEEDS), "jitter_levels": levels,
           "jitter_source": str(jpath.name), "tie_band": TIE, "default_budget_nodes": BTSConfig().budget_nodes,
           "rows": rows, "per_config": per_config, "summary": summary}
    if args.recheck_seeds:
        res["rechecks"] = recheck(res, args.recheck_seeds, args.workers)
    out.write_text(json.dumps(res, indent=1))
    for k, v in summary.items():
        print(f"{k:28s} mean {v['mean_vs_greedy']:+.2%} [{v['min']:+.2%}, {v['max']:+.2%}] "
              f"W/T/L {v['wins']}/{v['ties']}/{v['losses']} steady {v['steady_mean_vs_greedy']:+.2%} "
              f"budget hits {v['budget_hits']}/{v['decisions']}")
    print(f"wrote {out} [{time.perf_counter() - t0:.0f}s]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
