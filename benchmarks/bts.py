"""BTS decision-time benchmark.

For B = 32, 64, 128 trajectories per step (G = 16 generations per prompt, fragments of 2, T = 10 sampling
steps, S = 6 trained timesteps, 8 generators + 8 trainer ranks) and train/generate time ratios 0.1, 0.5, 1, 2
(ratio of the trainer pool's per-step work to the generator pool's), run ``gap_tsp_tag`` for a few steps in
the simulator with 5 % log-normal jitter and record every BTS decision's search time.

Writes ``benchmarks/results/bts.json``: a list of rows {batch, t_over_g, decisions, median_ms, max_ms,
memo_hit_rate, budget_hits}. Run: ``python benchmarks/bts.py [--steps 5] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from digenrl.schedule import StepPlan
from digenrl.sim.executor import simulate

GEN_S = 1.0      # seconds per generation (T denoising steps + decode + reward)
T, S, G, FRAG = 10, 6, 16, 2
N_GEN = N_TRAIN = 8


class LinearCost:
    """Synthetic costs: generation linear in the batch, chunk time linear in cells, fixed collectives."""

    def __init__(self, cell_s: float):
        self.cell_s = cell_s

    def time(self, op: str, batch: int, pool: str) -> float:
        return {"denoise": GEN_S * 0.9 / T * batch, "vae_decode": GEN_S * 0.08 * batch,
                "reward": GEN_S * 0.02 * batch, "transfer": 0.0, "train_chunk": 0.01 + self.cell_s * batch,
                "allreduce": 0.4, "optimizer": 0.1, "publish": 0.5, "tag_switch": 0.2}[op]


def run(batch: int, ratio: float, steps: int, seed: int = 0) -> dict:
    # ratio = (B * S * cell_s / N_TRAIN) / (B * GEN_S / N_GEN)  ->  cell_s = ratio * GEN_S / S
    cost = LinearCost(ratio * GEN_S / S)
    plan = StepPlan(prompts=batch // G, generations=G, fragment_size=FRAG, trained_timesteps=S,
                    sampling_steps=T, chunk_generations=4, chunk_timesteps=3,
                    generators=tuple(f"g{i}" for i in range(N_GEN)),
                    trainers=tuple(f"t{i}" for i in range(N_TRAIN)), mode="gap_tsp_tag", steps=steps)
    res = simulate(plan, cost, jitter=0.05, seed=seed, record=False)
    times = res.bts_times
    return {"batch": batch, "t_over_g": ratio, "decisions": len(times),
            "median_ms": statistics.median(times) * 1e3 if times else 0.0,
            "max_ms": max(times) * 1e3 if times else 0.0,
            "memo_hit_rate": res.bts["memo_hit_rate"], "budget_hits": res.bts["budget_hits"],
            "tag_fragments_per_step": res.tag_fragments_per_step}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bts.json"))
    args = ap.parse_args(argv)
    rows = []
    t0 = time.perf_counter()
    for batch in (32, 64, 128):
        for ratio in (0.1, 0.5, 1.0, 2.0):
            row = run(batch, ratio, args.steps)
            rows.append(row)
            print(json.dumps(row))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    print(f"wrote {args.out} in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
