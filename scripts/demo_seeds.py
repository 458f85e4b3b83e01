"""Run the demo (``digenrl train``, default config) for several seeds and record the eval rewards.

    python scripts/demo_seeds.py [--seeds 0 1 2] [--out benchmarks/results/demo_seeds.json] [key=value ...]
    python scripts/demo_seeds.py --merge a.json b.json [--out ...]    # seeds run separately, one results file
    python scripts/demo_seeds.py --table [--out ...]                  # the demo table (docs/getting_started.md, README) from the results file
    python scripts/demo_seeds.py --fast [--seeds 0 1 2]               # the demo on the fast generator path

``--fast`` runs the demo disaggregated with the generator pool's inference copy (docs/fast_generator.md): the
overrides in ``FAST`` (gap_tsp_tag, a compiled bf16 generator, logp_old recomputed by the trainers; the tiny DiT
has no LoRA, so nothing to merge) before any given on the command line, into ``demo_seeds_fast.json`` by default.

Each seed runs in its own process (``digenrl train seed=N run_dir=runs/demo_seedN``), one after another, with
the wall time and the machine's load average around it (the figures are only comparable on an idle machine).
The results file holds per seed the initial / final / peak eval reward, the eval curve, the wall time and the
CPU seconds of the run (user + system, independent of other load on the machine); the
The demo table of README.md and docs/getting_started.md is regenerated from it by scripts/benchmarks_doc.py (``--table`` prints the Markdown table).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAST = ["runtime.mode=gap_tsp_tag", "generator.compile=default", "generator.dtype=bfloat16",
        "train.old_logprob=recompute"]


def run_seed(seed: int, overrides: list[str], run_root: Path) -> dict:
    run_dir = run_root / f"demo_seed{seed}"
    cmd = [sys.executable, "-m", "digenrl.cli", "train", f"seed={seed}", f"run_dir={run_dir}", "log.progress=false",
           *overrides]
    import resource

    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    if proc.returncode != 0:
        raise RuntimeError(f"seed {seed} failed:\n{proc.stderr[-2000:]}")
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    curve = [(r["step"], r["eval_reward"]) for r in rows if "eval_reward" in r]
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    return {"seed": seed, "eval_initial": curve[0][1], "eval_final": curve[-1][1],
            "eval_peak": max(v for _, v in curve), "eval_curve": curve, "wall_s": wall, "cpu_s": cpu,
            "train_wall_s": summary.get("wall_s"), "loadavg_1min_before": load0, "loadavg_1min_after": os.getloadavg()[0]}


def copy_figures(run_root: Path, seed: int, dest: Path) -> None:
    """runs/demo_seedN/{reward_curve,samples_before,samples_after}.png -> dest/demo_*.png."""
    import shutil

    src = run_root / f"demo_seed{seed}"
    for name in ("reward_curve", "samples_before", "samples_after"):
        shutil.copyfile(src / f"{name}.png", dest / f"demo_{name}.png")


def table(results: dict) -> str:
    lines = ["| seed | base generator | after RL (final) | peak during RL | wall time |", "|---|---|---|---|---|"]
    for r in results["runs"]:
        lines.append(f"| {r['seed']} | {r['eval_initial']:.3f} | {r['eval_final']:.3f} | {r['eval_peak']:.3f} | "
                     f"{r['wall_s']:.0f} s |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default=None, help="results file (default benchmarks/results/demo_seeds.json, with "
                    "--fast demo_seeds_fast.json)")
    ap.add_argument("--fast", action="store_true", help="the demo on the fast generator path (FAST overrides)")
    ap.add_argument("--runs", default=None, help="where the runs go (default runs/, with --fast runs/fast/); a "
                    "previous run of this script there is replaced (--overwrite)")
    ap.add_argument("--table", action="store_true", help="print the demo table of an existing results file")
    ap.add_argument("--merge", nargs="+", help="combine results files of seeds run separately (e.g. concurrently)")
    ap.add_argument("--figures", help="copy the first seed's reward curve and sample grids here (the demo's figures)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = str(ROOT / "benchmarks/results" / ("demo_seeds_fast.json" if args.fast else "demo_seeds.json"))
    if args.runs is None:
        args.runs = str(ROOT / "runs" / ("fast" if args.fast else ""))
    if args.fast:
        args.overrides = [*FAST, *args.overrides]
    if args.table:
        print(table(json.loads(Path(args.out).read_text())))
        return 0
    if args.merge:
        parts = [json.loads(Path(f).read_text()) for f in args.merge]
        out = {**parts[0], "runs": sorted((r for p in parts for r in p["runs"]), key=lambda r: r["seed"]),
               "note": "seeds run as separate processes at the same time; wall times include the sharing"}
        Path(args.out).write_text(json.dumps(out, indent=1))
        if args.figures:
            copy_figures(Path(args.runs), out["runs"][0]["seed"], Path(args.figures))
        print(table(out))
        return 0
    runs = []
    for s in args.seeds:
        runs.append(run_seed(s, [*args.overrides, "--overwrite"], Path(args.runs)))
        print(f"seed {s}: eval {runs[-1]['eval_initial']:.3f} -> {runs[-1]['eval_final']:.3f} "
              f"(peak {runs[-1]['eval_peak']:.3f}) in {runs[-1]['wall_s']:.0f} s", flush=True)
    out = {"command": "digenrl train seed=N " + " ".join(args.overrides), "cpus": os.cpu_count(), "runs": runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    if args.figures:
        copy_figures(Path(args.runs), args.seeds[0], Path(args.figures))
    print(table(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
