"""TCSS keeps the learning curve: eval-reward curves of the on-policy reference and of ``full`` with stale caps.

    python scripts/tcss_curves.py [--seeds 0 1 2] [--variants reference full_0.25 full_0.5] [--force]
    python scripts/tcss_curves.py --figure [--markdown]     # figure + docs/tcss_curves.md from the results file

Each (variant, seed) is one ``digenrl train`` process on the default demo config (``make demo``), one after another:

- ``reference``: the default single-process colocated mode (on-policy);
- ``full_<cap>``: ``runtime.mode=full`` on a private local Ray instance, 1 generator + 1 trainer, with
  ``runtime.max_stale_fraction=<cap>`` (TCSS: at most that share of a step's samples come from the previous
  weights).

After every finished run its eval curve (``metrics.jsonl`` rows with ``eval_reward``, the last one ``final``), its
summary and its wall time are written into the results file, so a partial set is never lost; pairs already present
are skipped unless ``--force``. ``--figure`` draws the mean over the seeds present and the min-max band per variant
(x = step, y = eval reward) and prints the Markdown paragraph and table; ``--markdown`` also writes it to
``docs/tcss_curves.md``. Every number in that text is computed from the results file.
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
RESULTS = ROOT / "benchmarks/results/tcss_curves.json"
FIGURE = ROOT / "docs/figures/tcss_curves.png"
MARKDOWN = ROOT / "docs/tcss_curves.md"
VARIANTS = ("reference", "full_0.25", "full_0.5")
DIFF_THRESHOLD = 0.05  # |mean_variant - mean_reference| above this at a step counts as "differ"


def variant_overrides(variant: str) -> list[str]:
    """``reference`` -> the default colocated mode; ``full_<cap>`` -> full mode, 1 generator + 1 trainer."""
    if variant == "reference":
        return []
    if variant.startswith("full_"):
        cap = float(variant.removeprefix("full_"))
        return ["runtime.mode=full", "runtime.generators=1", "runtime.trainers=1", f"runtime.max_stale_fraction={cap}"]
    raise ValueError(f"variant {variant!r}: expected 'reference' or 'full_<cap>'")


def read_run(run_dir: Path) -> dict:
    """Eval curve [(step, eval_reward)] from metrics.jsonl and summary.json of a finished run."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    curve = [[int(r["step"]), float(r["eval_reward"])] for r in rows if "eval_reward" in r]
    if not curve:
        raise RuntimeError(f"{run_dir}/metrics.jsonl: no row with eval_reward")
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    return {"eval_curve": curve, "eval_final": curve[-1][1], "final_row_marked": any(r.get("final") for r in rows),
            "summary": summary}


def run_one(variant: str, seed: int, run_root: Path) -> dict:
    run_dir = run_root / f"tcss_{variant}_seed{seed}"
    cmd = [sys.executable, "-m", "digenrl.cli", "train", f"seed={seed}", f"run_dir={run_dir}", "log.progress=false",
           *variant_overrides(variant)]
    git = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=ROOT)
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{variant} seed {seed} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"variant": variant, "seed": seed, "command": " ".join(cmd[2:]), **read_run(run_dir), "wall_s": wall,
            "tree_at_start": git.stdout.strip() or None, "loadavg_1min_before": load0, "loadavg_1min_after": os.getloadavg()[0]}


def load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"runs": []}


def store(results: dict, run: dict, path: Path) -> None:
    """Replace the (variant, seed) entry or append it, then write the whole file (atomically)."""
    results["runs"] = [r for r in results["runs"] if (r["variant"], r["seed"]) != (run["variant"], run["seed"])]
    results["runs"].append(run)
    results["runs"].sort(key=lambda r: (r["seed"], r["variant"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(path)


def aggregate(results: dict) -> dict[str, dict]:
    """Per variant over the seeds present: steps, mean, min, max of eval reward at each step.

    Only the steps that every seed of that variant evaluated are kept (the curves share ``eval.every``).
    """
    out: dict[str, dict] = {}
    for variant in sorted({r["variant"] for r in results["runs"]}, key=_variant_order):
        runs = sorted((r for r in results["runs"] if r["variant"] == variant), key=lambda r: r["seed"])
        per_seed = [dict((int(s), float(v)) for s, v in r["eval_curve"]) for r in runs]
        steps = sorted(set.intersection(*(set(c) for c in per_seed)))
        vals = [[c[s] for c in per_seed] for s in steps]
        out[variant] = {"seeds": [r["seed"] for r in runs], "steps": steps,
                        "mean": [sum(v) / len(v) for v in vals], "min": [min(v) for v in vals],
                        "max": [max(v) for v in vals],
                        "final": {r["seed"]: float(r["eval_final"]) for r in runs},
                        "per_seed": dict(zip((r["seed"] for r in runs), per_seed)),
                        "wall_s": {r["seed"]: r.get("wall_s") for r in runs},
                        "stale_fraction": {r["seed"]: r.get("summary", {}).get("stale_fraction", 0.0) for r in runs}}
    return out


def _variant_order(v: str) -> tuple:
    return (0, 0.0) if v == "reference" else (1, float(v.removeprefix("full_")) if v.startswith("full_") else 9.0)


def differences(agg: dict, reference: str = "reference", threshold: float = DIFF_THRESHOLD) -> dict[str, list]:
    """Per non-reference variant: [(step, mean_variant - mean_reference)] where |difference| > threshold."""
    if reference not in agg:
        return {}
    ref = dict(zip(agg[reference]["steps"], agg[reference]["mean"]))
    out = {}
    for v, a in agg.items():
        if v == reference:
            continue
        out[v] = [(s, m - ref[s]) for s, m in zip(a["steps"], a["mean"]) if s in ref and abs(m - ref[s]) > threshold]
    return out


def figure(agg: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, dax) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})
    ref = dict(zip(agg["reference"]["steps"], agg["reference"]["mean"])) if "reference" in agg else {}
    for v, a in agg.items():
        label = "on-policy reference (colocated)" if v == "reference" else \
            f"full, max_stale_fraction={v.removeprefix('full_')}"
        (line,) = ax.plot(a["steps"], a["mean"], marker="o", markersize=3, label=f"{label} (n={len(a['seeds'])})")
        ax.fill_between(a["steps"], a["min"], a["max"], color=line.get_color(), alpha=0.18, linewidth=0)
        if v != "reference" and ref:
            steps = [s for s in a["steps"] if s in ref]
            dax.plot(steps, [m - ref[s] for s, m in zip(a["steps"], a["mean"]) if s in ref], marker="o", markersize=3,
                     color=line.get_color())
    ax.set_ylabel("eval reward")
    ax.set_title("Eval reward: mean over seeds, band = min-max over seeds")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    for y in (-DIFF_THRESHOLD, DIFF_THRESHOLD):
        dax.axhline(y, color="grey", linestyle="--", linewidth=0.8)
    dax.axhline(0.0, color="black", linewidth=0.6)
    dax.set_xlabel("step")
    dax.set_ylabel("mean - reference")
    dax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _signed(x: float) -> str:
    """+0.012 / -0.012; 0.000 without a sign where it rounds to zero."""
    t = f"{x:+.3f}"
    return "0.000" if t in ("+0.000", "-0.000") else t


def markdown(agg: dict, threshold: float = DIFF_THRESHOLD) -> str:
    """The page's paragraph and table; every number is read from ``agg``."""
    if not agg:
        return "No TCSS curve results yet.\n"
    seeds = sorted({s for a in agg.values() for s in a["seeds"]})
    lines = ["| variant | " + " | ".join(f"seed {s} final" for s in seeds)
             + " | mean final | share of stale samples (run mean, per seed) | wall time per run |",
             "|---|" + "---|" * (len(seeds) + 3)]
    for v, a in agg.items():
        cells = [f"{a['final'][s]:.3f}" if s in a["final"] else "not run" for s in seeds]
        mean_final = sum(a["final"].values()) / len(a["final"])
        walls = [w for w in a["wall_s"].values() if w is not None]
        wall = "-" if not walls else f"{min(walls):.0f} s" if round(min(walls)) == round(max(walls)) else \
            f"{min(walls):.0f}-{max(walls):.0f} s"
        stale = ", ".join(f"{a['stale_fraction'][s]:.3f}" for s in a["seeds"])
        lines.append(f"| {v} | " + " | ".join(cells) + f" | {mean_final:.3f} | {stale} | {wall} |")
    table = "\n".join(lines)
    diffs = differences(agg, threshold=threshold)
    text = [f"Eval reward every `eval.every` steps of the default demo (`digenrl train`), seeds "
            f"{', '.join(map(str, seeds))}; `full` runs 1 generator + 1 trainer on Ray with TCSS caps "
            f"`runtime.max_stale_fraction` 0.25 and 0.5 (figure: `docs/figures/tcss_curves.png`, regenerated by "
            f"`python scripts/tcss_curves.py --figure --markdown` from `benchmarks/results/tcss_curves.json`)."]
    missing = [f"{v} seed {s}" for v, a in agg.items() for s in seeds if s not in a["seeds"]]
    if missing:
        text.append("Not run (left out of the means): " + ", ".join(missing) + ".")
    for v, d in diffs.items():
        ref = dict(zip(agg["reference"]["steps"], agg["reference"]["mean"]))
        gap, at = max((abs(m - ref[s]), s) for s, m in zip(agg[v]["steps"], agg[v]["mean"]) if s in ref)
        ref_steps = set(agg["reference"]["steps"])
        shared = [s for s in agg[v]["steps"] if s in ref_steps]
        fin_diff = _signed(sum(agg[v]["final"].values()) / len(agg[v]["final"])
                           - sum(agg["reference"]["final"].values()) / len(agg["reference"]["final"]))
        if not d:
            text.append(f"**{v}** agrees with the reference: the seed means differ by at most {threshold} at all "
                        f"{len(shared)} shared eval steps (largest {gap:.3f} at step {at}); mean final eval differs by "
                        f"{fin_diff}.")
        else:
            where = ", ".join(f"step {s} ({_signed(x)})" for s, x in d)
            text.append(f"**{v}** agrees with the reference (seed means within {threshold}) at "
                        f"{len(shared) - len(d)} of {len(shared)} shared eval steps and differs at {where}; "
                        f"mean final eval differs by {fin_diff}.")
        pairs = [(abs(c[st] - agg["reference"]["per_seed"][sd][st]), sd, st) for sd, c in agg[v]["per_seed"].items()
                 if sd in agg["reference"]["per_seed"] for st in c if st in agg["reference"]["per_seed"][sd]]
        if pairs:
            g, sd, st = max(pairs)
            text[-1] += f" Same seed, same step: largest difference {g:.3f} (seed {sd}, step {st})."
    return "\n\n".join(text) + "\n\n" + table + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--runs", default=str(ROOT / "runs"))
    ap.add_argument("--force", action="store_true", help="re-run (variant, seed) pairs already in the results file")
    ap.add_argument("--no-start-after", help="HH:MM local time: start no new run after it")
    ap.add_argument("--figure", action="store_true", help="draw the figure and print the Markdown from the results")
    ap.add_argument("--markdown", action="store_true", help="with --figure: also write docs/tcss_curves.md")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.figure:
        agg = aggregate(load(out))
        if not agg:
            print(f"{out}: no runs", file=sys.stderr)
            return 2
        figure(agg, FIGURE)
        md = markdown(agg)
        print(md)
        if args.markdown:
            MARKDOWN.write_text("<!-- generated by scripts/tcss_curves.py --figure --markdown; do not edit -->\n\n" + md)
        return 0
    for v in args.variants:
        variant_overrides(v)  # bad variant name -> error before any run
    results = load(out)
    done = {(r["variant"], r["seed"]) for r in results["runs"]}
    for seed in args.seeds:
        for v in args.variants:
            if (v, seed) in done and not args.force:
                print(f"{v} seed {seed}: present, skipped", flush=True)
                continue
            if args.no_start_after and time.strftime("%H:%M") >= args.no_start_after:
                print(f"past {args.no_start_after}: not starting {v} seed {seed}", flush=True)
                return 0
            run = run_one(v, seed, Path(args.runs))
            store(results, run, out)
            print(f"{v} seed {seed}: final eval {run['eval_final']:.3f} in {run['wall_s']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
