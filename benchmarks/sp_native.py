"""The video models at their native size on 80 GB GPUs, planned with sequence parallelism (issue 39 part B).

    python benchmarks/sp_native.py                 # writes benchmarks/results/sp_native.json
    python benchmarks/sp_native.py --table         # prints the results file as the tables of docs/sequence_parallel.md

Presets ``hunyuan_video_native`` (720 x 1280 x 129 frames) and ``wan_native`` (720p x 81 frames) on testbed B (H100
SXM 80 GB, 400 Gb/s), full fine-tuning on FSDP with recomputation, 8 prompts x 12 generations: for each GPU count
and mode, the planner's choice (``sim.scenario.run_mode``: split, fragment, shard groups, publish path, and the
Ulysses degrees of the trainer lanes and the generators) simulated for 4 steps; and the memory plan of one trainer
rank (``train.memory.plan_memory`` with the roofline's inputs, ``sim.memory.preset_inputs``) at each degree, the
chosen plan's shard group: 1 cell's GiB and the cells that fit 80 GiB (0: refused; n/a: the degree does not divide
the group's ranks). The all-to-all time of one
sample-forward and its share of a training cell come from the chosen plan's cost model (``sim.roofline``).
A simulation, not a GPU measurement: seconds of CPU.
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

RESULTS = ROOT / "benchmarks" / "results" / "sp_native.json"
PRESETS = ("hunyuan_video_native", "wan_native")
GPUS = (16, 32)
MODES = ("colocated", "gap_tsp_tag", "full")
DEGREES = (1, 2, 4, 8)
STEPS = 4


def _memory(setup, ranks: int) -> dict:
    """Per trainer rank of a shard group of ``ranks``: {degree: {"gib_1cell", "cells"}} at 80 GiB."""
    from digenrl.sim.efficiency import efficiency_for
    from digenrl.sim.memory import preset_inputs
    from digenrl.train.memory import GiB, plan_memory

    w, m = setup.workload, setup.model
    base = preset_inputs(m, w, w.training, efficiency_for(setup.testbed.gpu).reserve_gb)
    out = {}
    for d in DEGREES:
        p = replace(base, sharding="fsdp", ranks=ranks, sequence_parallel=d, forwards_per_cell=m.forwards_per_step)
        plan = plan_memory(p)
        out[str(d)] = {"gib_1cell": plan.total(1) / GiB, "cells": plan.max_cells(setup.testbed.gpu.memory_gb * GiB),
                       "items_gib": {k: v / GiB for k, v in plan.items.items()}}
    return out


def run() -> list[dict]:
    from digenrl.schedule.cost import TRAINER
    from digenrl.sim.presets import TESTBEDS, model_preset, workload_preset
    from digenrl.sim.scenario import PresetSource, Scenario, ScenarioError, run_mode

    rows = []
    for name in PRESETS:
        m, w = model_preset(name), workload_preset(name)
        for gpus in GPUS:
            s = Scenario(m, TESTBEDS["B"], w, gpus, steps=STEPS)
            for mode in MODES:
                row = {"preset": name, "gpus": gpus, "mode": mode,
                       "tokens": m.spec.latent_tokens(w.height, w.width, w.frames)}
                try:
                    r = run_mode(s, mode)
                except ScenarioError as e:
                    rows.append({**row, "error": str(e)})
                    continue
                c = r.candidate
                cost, _ = PresetSource(s, mode, split=c.split).build(c)
                base = getattr(cost, "base", cost)
                cell = base.time("train_chunk", base.lanes, TRAINER)
                rows.append({**row, "label": c.label(r.plan), "step_s": r.result.step_time,
                             "split": [c.split.n_gen, c.split.n_train], "sp": c.sequence_parallel,
                             "gen_sp": c.generator_sequence_parallel, "shard_groups": r.shard_groups,
                             "a2a_per_forward_s": base.a2a_s(TRAINER), "train_cell_s": cell,
                             "a2a_share_of_cell": base.train_a2a_s() / cell,
                             "memory": _memory(s, c.split.n_train // c.shard_groups)})
    return rows


def table(rows: list[dict]) -> str:
    out = ["| preset | GPUs | mode | plan | sp | generator sp | step (s) | a2a / forward (s) | a2a share of a cell |",
           "|---|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['preset']} | {r['gpus']} | {r['mode']} | refused: {r['error'][:120]} | | | | | |")
            continue
        out.append(f"| {r['preset']} | {r['gpus']} | {r['mode']} | {r['label']} | {r['sp']} | {r['gen_sp']} | "
                   f"{r['step_s']:.0f} | {r['a2a_per_forward_s']:.3f} | {r['a2a_share_of_cell']:.1%} |")
    out += ["", "| preset | GPUs | mode | shard group ranks | " + " | ".join(f"sp {d}: GiB (cells)" for d in DEGREES)
            + " |", "|---|---:|---|---:|" + "---:|" * len(DEGREES)]
    for r in rows:
        if "memory" in r:
            mem = r["memory"]
            out.append(f"| {r['preset']} | {r['gpus']} | {r['mode']} | {r['split'][1] // r['shard_groups']} | "
                       + " | ".join(f"{mem[str(d)]['gib_1cell']:.1f} ({mem[str(d)]['cells']})"
                                    if (r['split'][1] // r['shard_groups']) % d == 0 else "n/a" for d in DEGREES)
                       + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", action="store_true", help="print the results file as markdown tables")
    args = ap.parse_args(argv)
    if args.table:
        print(table(json.loads(RESULTS.read_text())["rows"]))
        return 0
    t0 = time.time()
    rows = run()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(RESULTS, json.dumps({"seconds": round(time.time() - t0, 1), "steps": STEPS, "testbed": "B",
                                            "rows": rows}, indent=1).encode())
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
