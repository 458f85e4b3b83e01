"""Rollout and training throughput of the built-in demo model on this machine (informational).

Reports, for the tiny DiT of the digits demo:
* rollout: denoising steps/s (trajectory-steps per second, i.e. batch x T / wall) for a step's batch;
* training: cells/s (one cell = forward+backward of one (generation, timestep) pair) for TSP chunks of
  several shapes.
Writes ``benchmarks/results/demo_throughput.json``.

    python benchmarks/demo_throughput.py [--threads 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from digenrl.algo.timesteps import select_timesteps
from digenrl.models.tiny_dit import DEFAULT_BASE, TinyDiTPolicy
from digenrl.rollout.sampler import SamplerSettings
from digenrl.tasks.digits import DigitsTask
from digenrl.schedule.layout import tile_grid
from digenrl.train.chunk_loss import LossSettings, train_cells
from digenrl.train.step_math import assign_advantages, generate

OUT = Path(__file__).resolve().parent / "results" / "demo_throughput.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    policy = TinyDiTPolicy.load(DEFAULT_BASE)
    P, G, T = 8, 8, 10
    prompts = DigitsTask().train_prompts(0, P, seed=0)
    rep = [p for p in prompts for _ in range(G)]
    gens = [g for _ in prompts for g in range(G)]
    plan = select_timesteps(T, fraction=0.5)
    settings = SamplerSettings(num_steps=T)
    rows = []
    best = float("inf")
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        batch = generate(policy, rep, gens, step=0, run_seed=0, version=0, settings=settings, plan=plan)
        best = min(best, time.perf_counter() - t0)
    rows.append({"what": "rollout", "batch": P * G, "sampling_steps": T, "denoise_steps_per_s": P * G * T / best, "wall_s": best})
    batch.rewards = torch.rand(len(batch), generator=torch.Generator().manual_seed(0))
    assign_advantages(batch, std_mode="group", adv_clip_max=5.0)
    groups = [batch.select(list(range(k * G, (k + 1) * G))) for k in range(P)]  # the prompt groups
    cells = len(batch) * len(plan.trained)
    for cg, ct in [(1, 1), (8, 1), (8, 2), (8, 5)]:
        best = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for g in groups:
                for chunk in tile_grid(list(range(G)), len(plan.trained), cg, ct):
                    train_cells(policy, g, chunk, settings=LossSettings(), loss_scale=1.0 / cells)
            best = min(best, time.perf_counter() - t0)
            policy.zero_grad(set_to_none=True)
        rows.append({"what": "train", "chunk": f"{cg}x{ct}", "cells_per_forward": cg * ct, "cells_per_s": cells / best, "wall_s": best})
    result = {"machine": platform.machine(), "threads": args.threads, "torch": torch.__version__,
              "params": sum(p.numel() for p in policy.parameters()), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
