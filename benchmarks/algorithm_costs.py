"""What each training algorithm costs per step, by mode, in the simulator (``train.algorithm``, ``sim.algorithms``).

    python benchmarks/algorithm_costs.py          # writes benchmarks/results/algorithm_costs.json
    python benchmarks/algorithm_costs.py --table  # prints the results file as a markdown table

For FLUX.1-dev and Wan2.1 on testbed B (exact roofline costs, 20 steps, split searched per mode): colocated,
gap_tsp, gap_tsp_tag and full step times of Flow-GRPO (T = 20, S = 12), GRPO-Guard (its means are 50 % more
trajectory bytes), MixGRPO (window 4 of T = 25, its FLUX recipe), MixGRPO-Flash (DPM-Solver++ 2M after the window,
compress ratio 0.4) and DiffusionNFT (ODE sampling, K = int(0.99 T) CFG-free training cells per sample; ``nft``
with its default soft old policy, one more no-grad forward per cell, ``nft_current`` without). The
simulator is deterministic, so the machine's load does not change the numbers; docs/simulation.md shows the
table (``scripts/simdoc_algorithms.py``).
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

RESULTS = ROOT / "benchmarks" / "results" / "algorithm_costs.json"
MODELS = (("flux", "B"), ("wan", "B"))
MODES = ("colocated", "gap_tsp", "gap_tsp_tag", "full")
# (label, algorithm kwargs, sampling steps T): MixGRPO's recipes sample 25 steps (Tencent-Hunyuan/MixGRPO,
# scripts/finetune/finetune_flux_grpo_MixGRPO*.sh); the others keep the workload's T = 20
ALGORITHMS = (("flow_grpo", {}, 20), ("grpo_guard", {"name": "grpo_guard"}, 20),
              ("mixgrpo", {"name": "mixgrpo", "window": 4}, 25),
              ("mixgrpo_flash", {"name": "mixgrpo", "window": 4, "flash_ratio": 0.4}, 25),
              ("nft", {"name": "nft"}, 20),  # its soft old policy (the default): + 1 no-grad forward per cell
              ("nft_current", {"name": "nft", "nft_old": "current"}, 20))  # old = the live weights: no second forward


def measure(steps: int = 20) -> list[dict]:
    from digenrl.sim.algorithms import Algorithm
    from digenrl.sim.scenario import Scenario, run_mode
    from digenrl.sim.presets import model_preset, testbed_preset, workload_preset

    rows = []
    for model, tb in MODELS:
        testbed = testbed_preset(tb)
        for label, kw, T in ALGORITHMS:
            w = replace(workload_preset(model), sampling_steps=T, algorithm=Algorithm(**kw))
            s = Scenario(model_preset(model), testbed, w, testbed.total, steps, 0.5)
            row = {"model": model, "testbed": tb, "algorithm": label, "T": T, "S": w.trained_timesteps,
                   "denoise_steps": w.denoise_steps}
            for mode in MODES:
                r = run_mode(s, mode)
                row[mode] = {"step_s": r.result.step_time, "split": [r.split.n_gen, r.split.n_train],
                             "gen_idle": r.result.gen_idle, "trainer_idle": r.result.trainer_idle}
            print(f"{model} {tb} {label}: colocated {row['colocated']['step_s']:.1f} s, "
                  f"full {row['full']['step_s']:.1f} s", flush=True)
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    head = ("| model | algorithm | T | S | denoising steps | colocated (s) | gap_tsp (s) | gap_tsp_tag (s) | full (s) "
            "| full vs colocated | full vs Flow-GRPO's full |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        base = next(b for b in rows if b["model"] == r["model"] and b["algorithm"] == "flow_grpo")
        cells = [f"{r['model']} ({r['testbed']})", r["algorithm"], str(r["T"]), str(r["S"]), str(r["denoise_steps"])]
        cells += [f"{r[m]['step_s']:.1f}" for m in MODES]
        cells += [f"{r['colocated']['step_s'] / r['full']['step_s']:.3f}x",
                  f"{base['full']['step_s'] / r['full']['step_s']:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20, help="steps simulated per run (default 20)")
    ap.add_argument("--table", action="store_true", help="print the results file as a markdown table")
    args = ap.parse_args()
    if args.table:
        print(table(json.loads(RESULTS.read_text())["rows"]))
        return 0
    t0 = time.time()
    rows = measure(args.steps)
    out = {"steps": args.steps, "seconds": round(time.time() - t0, 1), "rows": rows}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(RESULTS, json.dumps(out, indent=1).encode())
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
