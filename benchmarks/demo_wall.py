"""The demo's wall time on two versions of the code, side by side in one session (issue 37: "within 10% of
today's").

Runs ``digenrl train`` (the default config: the colocated demo) from each source tree in turn, alternating
A, B, A, B, ... so that a change of the machine's speed hits both alike, with the same seed and overrides, and
records each run's wall time (the whole process, start-up included, and the run's own ``summary.json``
``wall_s`` where that version writes it), the 1-min load average before each run, and the ratio B / A of the
medians. ``--old`` is a source tree (a ``git worktree`` of an earlier commit: its ``src/``); the new tree is this
checkout's ``src/``.

    git worktree add /tmp/old <commit>
    python benchmarks/demo_wall.py --old /tmp/old [--steps 40] [--pairs 3] [--out ...]

Writes ``benchmarks/results/demo_wall.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commit(tree: Path) -> str:
    out = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "?"


def one_run(tree: Path, steps: int, seed: int, work: Path) -> dict:
    run_dir = work / f"run-{tree.name}-{time.monotonic_ns()}"
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "digenrl.cli", "train", f"run_dir={run_dir}", f"steps={steps}",
                           f"seed={seed}", "log.progress=false", "log.print_every=0"],
                          env=env, capture_output=True, text=True, cwd=str(tree))
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{tree}: digenrl train failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    return {"process_s": wall, "run_wall_s": summary.get("wall_s"), "loadavg_1min_before": load}


def markdown(res: dict) -> str:
    """The side-by-side table of a results file (``scripts/benchmarks_doc.py`` block ``demo_wall``)."""
    rows = ["| code | commit | runs (s, whole process) | median (s) | 1-min load before |", "|---|---|---|---|---|"]
    for name in ("old", "new"):
        runs = res["runs"][name]
        times = ", ".join(f"{r['process_s']:.1f}" for r in runs)
        loads = ", ".join(f"{r['loadavg_1min_before']:.2f}" for r in runs)
        commit = res[name + "_commit"]
        rows.append(f"| {name} | `{commit}` | {times} | {res['median_process_s'][name]:.1f} | {loads} |")
    return ("\n".join(rows) + f"\n\n`digenrl train` (the demo, {res['steps']} steps, seed {res['seed']}), the two "
            f"versions alternating, {res['pairs']} runs each on {res['cpus']} CPUs: new / old = "
            f"{res['new_over_old']:.3f} (medians).\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="the earlier source tree (a git worktree of an earlier commit)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "demo_wall.json"))
    args = ap.parse_args(argv)
    old = Path(args.old).resolve()
    if not (old / "src" / "digenrl").is_dir():
        ap.error(f"--old: {old} has no src/digenrl (give a source tree of DigenRL)")
    for name in ("steps", "pairs"):
        if getattr(args, name) < 1:
            ap.error(f"--{name}: must be >= 1 (got {getattr(args, name)})")
    runs = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            for name, tree in (("old", old), ("new", ROOT)) if i % 2 == 0 else (("new", ROOT), ("old", old)):
                runs[name].append(one_run(tree, args.steps, args.seed, Path(tmp)))
                r = runs[name][-1]
                print(f"pair {i + 1}/{args.pairs} {name}: {r['process_s']:.1f} s (load {r['loadavg_1min_before']:.2f})",
                      flush=True)
    med = {k: statistics.median(r["process_s"] for r in v) for k, v in runs.items()}
    out = {"steps": args.steps, "pairs": args.pairs, "seed": args.seed, "old_commit": _commit(old),
           "new_commit": _commit(ROOT), "cpus": os.cpu_count(), "runs": runs, "median_process_s": med,
           "new_over_old": med["new"] / med["old"]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"median: old {med['old']:.1f} s, new {med['new']:.1f} s, new / old {out['new_over_old']:.3f}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
