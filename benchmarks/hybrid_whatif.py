"""What hybrid sharding (HSDP) would buy, by the simulator: the trainer pool as k shard groups of g = N / k ranks.

    python benchmarks/hybrid_whatif.py                 # writes benchmarks/results/hybrid_whatif.json
    python benchmarks/hybrid_whatif.py --table         # prints the results file

NOT a feature of the runtime: the Ray runtime runs one shard group (``control.run_plan.shard_groups``). This
prices the issue-19 item "hybrid sharding" before it is built. Each group is one scheduler trainer of g ranks
(``StepPlan.shard_ranks`` = g): its chunks and TAG gangs (at most g fragments of one prompt group,
``layout.gang_size``) are collectives of its g ranks, priced by the roofline of a g-rank shard group (parameters,
master weights and Adam moments sharded over g; gathers at the testbed's inter-node rate, as for one group, so
intra-node NVLink is not credited); the commit adds the cross-replica all-reduce of the fp32 gradient shards,
2 (k - 1) / k x 4 x trainable / g bytes at the link rate. ``full`` mode, exact costs, 20 steps; for each k the
generator count is searched around the one-group plan's (+-3), every fragment size, TAG with and without the
inference copy, the cheaper publish path; the choice by a 3-step probe, as the planner does.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from digenrl.safe_files import atomic_write_bytes  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "hybrid_whatif.json"
CONFIGS = [("flux", "B"), ("qwen-image", "B"), ("hunyuan", "A"), ("wan", "B")]


class HybridCost:
    """A g-rank shard group's roofline plus the commit's all-reduce across k replicas."""

    def __init__(self, base, k: int, g: int):
        self.base, self.k, self.g = base, k, g

    def time(self, op: str, batch: int, pool: str) -> float:
        t = self.base.time(op, batch, pool)
        if op == "allreduce" and self.k > 1:
            t += 2.0 * (self.k - 1) / self.k * 4.0 * self.base.trainable / self.g / self.base.net
        return t


def plan_for(setup, split, k: int, fragment: int | None, copy: bool, publish: str):
    from digenrl.schedule import Durations, StepPlan
    from digenrl.schedule.layout import choose_chunk_shape
    from digenrl.sim.planner import with_training
    from digenrl.sim.roofline import RooflineCost

    g = split.n_train // k
    s = with_training(setup, copy, publish)
    w = s.workload
    base = RooflineCost(s.model, w, s.testbed, split.n_gen, g, False, gen_gpu=split.gen_gpu, train_gpu=split.train_gpu)
    cost = HybridCost(base, k, g)
    gens = tuple(f"gen{i}" for i in range(split.n_gen))
    trainers = tuple(f"shard{i}" for i in range(k))
    f = fragment or w.generations
    probe = StepPlan(w.prompts, w.generations, f, w.trained_timesteps, w.denoise_steps, 1, 1, gens, trainers,
                     "full", s.steps, s.max_stale_fraction, shard_ranks=g, publish_joins=publish == "broadcast")
    dur = Durations(probe, cost)
    cg, cs = choose_chunk_shape(w.generations, w.trained_timesteps, k, dur.train, base.max_chunk)
    return cost, replace(probe, chunk_generations=cg, chunk_timesteps=cs), base


def best_for_k(setup, k: int, around: int) -> dict | None:
    from digenrl.sim.executor import simulate
    from digenrl.sim.planner import fragment_sizes, split_options
    from digenrl.sim.roofline import InfeasibleError

    short = replace(setup, steps=3)
    best = None
    for split in split_options(setup):
        if abs(split.n_gen - around) > 3 or split.n_train % k:
            continue
        for copy in (False, True):
            for publish in ("object_store", "broadcast"):
                try:
                    _, _, base = plan_for(short, split, k, None, copy, publish)
                except InfeasibleError:
                    continue
                for f in fragment_sizes(setup.workload, base.max_fragment):
                    cost, plan, _ = plan_for(short, split, k, f, copy, publish)
                    t = simulate(plan, cost, record=False).step_time
                    if best is None or t < best[0]:
                        best = (t, split, f, copy, publish)
    if best is None:
        return None
    _, split, f, copy, publish = best
    cost, plan, _ = plan_for(setup, split, k, f, copy, publish)
    res = simulate(plan, cost, record=False)
    return {"k": k, "group_ranks": split.n_train // k, "split": [split.n_gen, split.n_train], "fragment": f,
            "tag_copy": copy, "publish": publish, "chunk": [plan.chunk_generations, plan.chunk_timesteps],
            "step_s": res.step_time, "gen_idle": res.gen_idle, "trainer_idle": res.trainer_idle,
            "tag_fragments_per_step": res.tag_fragments_per_step}


def measure() -> list[dict]:
    from digenrl.sim.planner import Scenario, run_mode
    from digenrl.sim.presets import WORKLOADS, model_preset, testbed_preset

    rows = []
    for model, tb in CONFIGS:
        testbed = testbed_preset(tb)
        s = Scenario(model_preset(model), testbed, WORKLOADS[model], testbed.total, 20, 0.5)
        co = run_mode(s, "colocated").result.step_time
        one = run_mode(s, "full")
        row = {"model": model, "testbed": tb, "colocated_s": co, "one_group_s": one.result.step_time,
               "one_group_split": [one.n_gen, one.n_train], "hybrid": []}
        for k in (2, 3, 4, 6):
            r = best_for_k(s, k, one.n_gen)
            if r is not None:
                row["hybrid"].append(r)
        rows.append(row)
        best = min(row["hybrid"], key=lambda r: r["step_s"]) if row["hybrid"] else None
        print(f"{model} {tb}: colocated {co:.1f} s, one group {row['one_group_s']:.1f} s"
              + (f", best hybrid k={best['k']} {best['step_s']:.1f} s" if best else ""), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| model | testbed | colocated (s) | full, one group | best hybrid (k x g ranks) | full vs colocated: "
             "one group -> hybrid |", "|---|---|---|---|---|---|"]
    for r in rows:
        b = min(r["hybrid"], key=lambda x: x["step_s"]) if r["hybrid"] else None
        hy = f"{b['step_s']:.1f} s ({b['k']} x {b['group_ranks']}, split {b['split'][0]}+{b['split'][1]})" if b else "-"
        ratio = (f"{r['colocated_s'] / r['one_group_s']:.3f}x -> {r['colocated_s'] / b['step_s']:.3f}x" if b
                 else f"{r['colocated_s'] / r['one_group_s']:.3f}x")
        lines.append(f"| {r['model']} | {r['testbed']} | {r['colocated_s']:.1f} | {r['one_group_s']:.1f} s "
                     f"({r['one_group_split'][0]}+{r['one_group_split'][1]}) | {hy} | {ratio} |")
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
