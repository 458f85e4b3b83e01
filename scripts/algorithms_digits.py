"""Compare the training algorithms on the CPU digits demo: eval reward against steps and compute, 3 seeds each.

    python scripts/algorithms_digits.py                    # every algorithm x seeds 0 1 2, then the page
    python scripts/algorithms_digits.py --algorithms nft --seeds 0   # a subset, merged into the results file
    python scripts/algorithms_digits.py --render           # docs/algorithms.md + figure from the results file

Each run is ``digenrl train`` (the built-in demo: colocated, single process) with ``train.algorithm`` and the
overrides below, one after another (``scripts/demo_seeds.run_seed``: wall time, CPU seconds of the run, load
average around it). The compute axis is the run's CPU seconds (user + system), which other load on the
machine changes much less than wall time. Results: ``benchmarks/results/algorithms_digits.json``; page:
``docs/algorithms.md`` with ``docs/figures/algorithms_digits.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_seeds import run_seed  # noqa: E402

sys.path.insert(0, str(ROOT / "src"))
from digenrl.safe_files import atomic_write_bytes  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "algorithms_digits.json"
PAGE = ROOT / "docs" / "algorithms.md"
FIGURE = ROOT / "docs" / "figures" / "algorithms_digits.png"
# the demo's own settings (src/digenrl/config.py defaults) plus what each algorithm needs on it
ALGORITHMS: dict[str, list[str]] = {
    "flow_grpo": [],
    "grpo_guard": ["train.algorithm=grpo_guard"],
    "mixgrpo": ["train.algorithm=mixgrpo", "train.window_size=4"],  # T = 10: window range [0, 8)
    "nft": ["train.algorithm=nft"],
}


def _record(r: dict) -> dict:
    """Add one run to the results file (read, replace the same (algorithm, seed), write atomically) under an OS
    file lock, so two invocations running different algorithms at once both keep their runs."""
    import fcntl

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS.with_name(RESULTS.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"runs": []}
        data["runs"] = [x for x in data["runs"] if (x["algorithm"], x["seed"]) != (r["algorithm"], r["seed"])] + [r]
        atomic_write_bytes(RESULTS, json.dumps(data, indent=1).encode())
    return data


def run(algorithms: list[str], seeds: list[int], runs: Path) -> dict:
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"runs": []}
    for algo in algorithms:
        for seed in seeds:
            r = run_seed(seed, ALGORITHMS[algo] + ["--overwrite"], runs / f"algo_{algo}")
            r.update(algorithm=algo, overrides=ALGORITHMS[algo])
            print(f"{algo} seed {seed}: eval {r['eval_initial']:.3f} -> {r['eval_final']:.3f} "
                  f"(peak {r['eval_peak']:.3f}), {r['cpu_s']:.0f} CPU s, {r['wall_s']:.0f} s", flush=True)
            data = _record(r)
    return data


def summary(data: dict) -> list[dict]:
    rows = []
    for algo in ALGORITHMS:
        rs = sorted((r for r in data["runs"] if r["algorithm"] == algo), key=lambda r: r["seed"])
        if not rs:
            continue
        mean = lambda k: sum(r[k] for r in rs) / len(rs)  # noqa: E731
        hit = [next((s for s, v in r["eval_curve"] if v >= 0.9), None) for r in rs]
        rows.append({"algorithm": algo, "seeds": [r["seed"] for r in rs], "initial": mean("eval_initial"),
                     "final": mean("eval_final"), "final_min": min(r["eval_final"] for r in rs),
                     "peak": mean("eval_peak"), "cpu_s": mean("cpu_s"), "wall_s": mean("wall_s"),
                     "steps_to_0.9": hit, "learns": all(r["eval_initial"] <= 0.7 and r["eval_final"] >= 0.9
                                                        for r in rs)})
    return rows


def figure(data: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for algo in ALGORITHMS:
        rs = [r for r in data["runs"] if r["algorithm"] == algo]
        for i, r in enumerate(rs):
            steps = [s for s, _ in r["eval_curve"]]
            vals = [v for _, v in r["eval_curve"]]
            last = max(steps) or 1
            cpu = [r["cpu_s"] * s / last for s in steps]  # the run's CPU seconds, spread evenly over its steps
            kw = dict(label=algo if i == 0 else None, color=f"C{list(ALGORITHMS).index(algo)}", alpha=0.8, lw=1.2)
            axes[0].plot(steps, vals, **kw)
            axes[1].plot(cpu, vals, **kw)
    for ax, xl in zip(axes, ("training step", "CPU seconds of the run (evenly spread over its steps)")):
        ax.axhline(0.9, color="grey", lw=0.6, ls="--")
        ax.set_xlabel(xl)
        ax.set_ylabel("eval reward (digits classifier)")
        ax.legend(fontsize=8)
    fig.suptitle("Training algorithms on the CPU digits demo, one line per seed")
    FIGURE.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(FIGURE, dpi=110, bbox_inches="tight")
    plt.close(fig)


def render(data: dict) -> str:
    rows = summary(data)
    lines = ["# Training algorithms on the digits demo\n",
             "Generated by `scripts/algorithms_digits.py` from `benchmarks/results/algorithms_digits.json` (do not "
             "edit by hand). Each run is the built-in CPU demo (`digenrl train`, colocated, one process) with "
             "`train.algorithm` and the overrides listed, on a 2-core machine; each invocation of the script runs its "
             "seeds one after another, and two invocations may run at once (one core each). CPU seconds are the "
             "run's own user + system time; wall time depends on the machine's other load (the load average "
             "around each run is in the results file).\n",
             "| algorithm | overrides | seeds | eval before | eval after (mean, min) | peak | steps to 0.9 "
             "| CPU s | wall s | learns (<= 0.7 -> >= 0.9, every seed) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ov = " ".join(f"`{o}`" for o in ALGORITHMS[r["algorithm"]]) or "(the demo's defaults)"
        hit = ", ".join("-" if h is None else str(h) for h in r["steps_to_0.9"])
        lines.append(f"| {r['algorithm']} | {ov} | {', '.join(map(str, r['seeds']))} | {r['initial']:.3f} | "
                     f"{r['final']:.3f}, {r['final_min']:.3f} | {r['peak']:.3f} | {hit} | {r['cpu_s']:.0f} | "
                     f"{r['wall_s']:.0f} | {'yes' if r['learns'] else 'no'} |")
    lines += ["", "nft runs with DiffusionNFT's own defaults: the soft old policy (`train.nft_old_policy=soft`, "
              "`nft_old_decay` (0, 0.001, 0.5): the generators sample with it and v_old is its forward) and the "
              "DPM-Solver++ 2M sampler (`sampler.nft_solver=dpmpp_2m`, the reference's `dpm2`), eval with the Euler "
              "ODE like every algorithm.\n",
              f"![eval reward per step and per CPU second](figures/{FIGURE.name})\n",
              "The simulator's price of each algorithm's step on GPU testbeds is in docs/simulation.md "
              "(\"Per algorithm\").\n"]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=list(ALGORITHMS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--runs", default=str(ROOT / "runs"))
    ap.add_argument("--render", action="store_true", help="only write the page and figure from the results file")
    ap.add_argument("--flow-grpo-from", metavar="DEMO_SEEDS_JSON",
                    help="take flow_grpo's runs from a scripts/demo_seeds.py results file (the same command: the "
                         "demo with no override) instead of running them again")
    args = ap.parse_args(argv)
    if args.flow_grpo_from:
        demo = json.loads(Path(args.flow_grpo_from).read_text())
        if demo.get("command", "").split() != ["digenrl", "train", "seed=N"]:
            print(f"algorithms_digits: error: --flow-grpo-from: {args.flow_grpo_from} ran {demo.get('command')!r}, "
                  "not the demo without overrides", file=sys.stderr)
            return 2
        for r in demo["runs"]:
            if r["seed"] in args.seeds:
                _record(dict(r, algorithm="flow_grpo", overrides=[]))
        args.algorithms = [a for a in args.algorithms if a != "flow_grpo"]
    if args.render:
        if not RESULTS.exists():
            print(f"algorithms_digits: error: --render: no results file {RESULTS}", file=sys.stderr)
            return 2
        data = json.loads(RESULTS.read_text())
    else:
        data = run(args.algorithms, args.seeds, Path(args.runs))
    figure(data)
    PAGE.write_text(render(data))
    print(f"wrote {PAGE} and {FIGURE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
