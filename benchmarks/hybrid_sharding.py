"""Hybrid sharding (HSDP), per shard-group count: the trainer pool as k shard groups of g = N / k ranks.

    python benchmarks/hybrid_sharding.py                 # writes benchmarks/results/hybrid_sharding.json
    python benchmarks/hybrid_sharding.py --table         # prints the results file

The runtime runs it (``train.shard_groups`` = k) and the planner searches k (``sim.scenario.PresetSource.values``).
This is the ablation behind that choice: ``full`` mode, exact roofline costs, 20 steps, for each k the split,
fragment size, TAG inference copy and publish path searched by the planner itself (``run_mode(...,
shard_groups=k)``; k = 1 is one group of all ranks). Each group is one scheduler trainer of g ranks
(``StepPlan.shard_ranks`` = g): its chunks and TAG gangs (at most g fragments of one prompt group) are
collectives of its g ranks, priced by the roofline of a g-rank shard group (parameters, master weights and Adam
moments sharded over g; gathers at the testbed's inter-node rate, as for one group, so intra-node NVLink is not
credited); the commit adds the cross-replica all-reduce of the fp32 gradient shards, 2 (k - 1) / k x 4 x
trainable / g bytes at the link rate (``sim.roofline``). The planner's own pick (k searched by its 8-step probes)
(the fastest over the 20 steps of the candidates it probed) is listed beside the best k.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from digenrl.safe_files import atomic_write_bytes  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "hybrid_sharding.json"
CONFIGS = [("flux", "B"), ("qwen-image", "B"), ("hunyuan", "A"), ("wan", "B")]
GROUPS = (1, 2, 3, 4, 6)


def _row(r, k: int | None = None) -> dict:
    """``k``: the pinned shard-group count (a pinned k whose groups are one rank or one sequence-parallel lane
    each runs as k replicas, ``ModeRun.shard_groups`` 1, but is the row of k); None: the planner's own."""
    res = r.result
    k = r.shard_groups if k is None else k
    return {"k": k, "group_ranks": r.n_train // k, "split": [r.n_gen, r.n_train],
            "fragment": r.plan.fragment_size, "tag_copy": r.tag_copy, "publish": r.publish,
            "chunk": [r.plan.chunk_generations, r.plan.chunk_timesteps], "step_s": res.step_time,
            "gen_idle": res.gen_idle, "trainer_idle": res.trainer_idle,
            "tag_fragments_per_step": res.tag_fragments_per_step}


def measure() -> list[dict]:
    from digenrl.sim.scenario import Scenario, ScenarioError, run_mode
    from digenrl.sim.presets import model_preset, testbed_preset, workload_preset

    rows = []
    for model, tb in CONFIGS:
        testbed = testbed_preset(tb)
        s = Scenario(model_preset(model), testbed, workload_preset(model), testbed.total, 20, 0.5)
        co = run_mode(s, "colocated").result.step_time
        row = {"model": model, "testbed": tb, "colocated_s": co, "per_k": [], "planner": _row(run_mode(s, "full"))}
        for k in GROUPS:
            try:
                row["per_k"].append(_row(run_mode(s, "full", shard_groups=k), k))
            except ScenarioError:  # no split of the GPUs has trainer ranks that k divides and that fit
                continue
        rows.append(row)
        best = min(row["per_k"], key=lambda r: r["step_s"])
        print(f"{model} {tb}: colocated {co:.1f} s, one group {row['per_k'][0]['step_s']:.1f} s, best k={best['k']} "
              f"{best['step_s']:.1f} s, planner k={row['planner']['k']} {row['planner']['step_s']:.1f} s", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    ks = sorted({h["k"] for r in rows for h in r["per_k"]})
    head = ("| model | testbed | colocated (s) | " + " | ".join(f"full, k = {k}" for k in ks)
            + " | planner's pick | vs colocated: k = 1 -> pick |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        by = {h["k"]: h for h in r["per_k"]}
        cells = [r["model"], r["testbed"], f"{r['colocated_s']:.1f}"]
        for k in ks:
            h = by.get(k)
            cells.append(f"{h['step_s']:.1f} s ({h['split'][0]}+{h['split'][1]})" if h else "-")
        p = r["planner"]
        cells.append(f"k = {p['k']}: {p['step_s']:.1f} s")
        one = by.get(1)
        cells.append((f"{r['colocated_s'] / one['step_s']:.3f}x -> " if one else "") + f"{r['colocated_s'] / p['step_s']:.3f}x")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", action="store_true")
    args = ap.parse_args()
    if args.table:
        print(table(json.loads(RESULTS.read_text())["rows"]))
        return 0
    t0 = time.time()
    rows = measure()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(RESULTS, json.dumps({"seconds": round(time.time() - t0, 1), "rows": rows}, indent=1).encode())
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
