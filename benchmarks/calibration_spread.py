"""How reproducible is a calibration on this machine? The same live workers calibrated several times back to back.

The CPU pipeline benchmark (``pipeline_cpu.py``) predicts each run from a calibration timed seconds before it.
Here one set of pools of that benchmark's workload (``--mode``, default colocated) is started once and
calibrated ``--times`` times in a row for each ``--repeats`` setting (``runtime.calibrate.calibrate``, as a run
does): nothing changes between the calibrations but the time, so their spread is what a calibration carries
of the machine's drift.

Writes ``benchmarks/results/calibration_spread.json``: per repeats setting, every calibration's seconds since
the first and its per-op costs (generator denoise step, the benchmark's training chunk, optimizer, publish), and
per op the min, max and max / min - 1.

Run: ``python benchmarks/calibration_spread.py [--mode colocated] [--repeats 8 32] [--times 6 4] [--out PATH]``
(about 2 min).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from pipeline_cpu import MODEL, WORKLOAD, mode_overrides  # noqa: E402

RESULTS = Path(__file__).parent / "results"
OPS = {"denoise_step_s": ("generator/denoise", 0), "train_chunk_s": ("train_chunk", -1),
       "optimizer_s": ("optimizer", 0), "publish_s": ("publish", 0)}


def spread(values: list[float]) -> dict:
    return {"min": min(values), "max": max(values), "max_over_min": max(values) / min(values) - 1.0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="colocated")
    ap.add_argument("--repeats", type=int, nargs="+", default=[8, 32], help="repeats per op of each calibration")
    ap.add_argument("--times", type=int, nargs="+", default=[6, 4], help="calibrations per repeats setting")
    ap.add_argument("--out", default=str(RESULTS / "calibration_spread.json"))
    args = ap.parse_args(argv)
    if len(args.repeats) != len(args.times) or min(args.repeats + args.times) < 1:
        ap.error(f"--repeats and --times: as many positive values each (got {args.repeats}, {args.times})")
    import ray
    import torch

    from digenrl.config import load_config
    from digenrl.control.run_plan import plan_run
    from digenrl.models.tiny_dit import TinyDiTConfig, TinyDiTPolicy
    from digenrl.runtime.calibrate import calibrate
    from digenrl.runtime.cluster import start_pools

    torch.set_num_threads(1)
    os.environ.setdefault("RAY_worker_niceness", "0")  # as the pipeline benchmark
    out: dict = {"mode": args.mode, "settings": []}
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        model = Path(tmp) / "model.safetensors"
        TinyDiTPolicy(TinyDiTConfig(**MODEL)).save(model)
        cfg = load_config(None, [f"model.path={model}", "steps=6", *WORKLOAD, *mode_overrides(args.mode),
                                 f"run_dir={tmp}/run"])
        run = plan_run(cfg)
        ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
        try:
            pools = start_pools(run)
            t0 = time.perf_counter()
            for repeats, times in zip(args.repeats, args.times):
                rows = []
                for _ in range(times):
                    ops = calibrate(run, pools, repeats=repeats)["ops"]
                    rows.append({"at_s": time.perf_counter() - t0,
                                 **{k: ops[op][i][1] for k, (op, i) in OPS.items()}})
                    print(f"repeats {repeats}: " + ", ".join(f"{k} {rows[-1][k] * 1e3:.1f} ms" for k in OPS),
                          flush=True)
                out["settings"].append({"repeats": repeats, "calibrations": rows,
                                        "spread": {k: spread([r[k] for r in rows]) for k in OPS}})
            pools.kill()
        finally:
            ray.shutdown()
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    for s in out["settings"]:
        print(f"repeats {s['repeats']}: " + ", ".join(
            f"{k} {v['min'] * 1e3:.1f}-{v['max'] * 1e3:.1f} ms (+{v['max_over_min']:.0%})" for k, v in s["spread"].items()))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
