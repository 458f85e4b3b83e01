"""Full stack vs colocation on the 10 GPU preset configurations, per commit of the planner / scheduler.

    python benchmarks/preset_ceiling.py --label after                 # this checkout, appended to the results
    python benchmarks/preset_ceiling.py --table                      # print the results file as a table

Each run simulates (virtual time, exact roofline costs, 20 steps, split searched by the planner of the code it
runs with) colocated, gap_tsp, gap_tsp_tag and full on HunyuanVideo A/B/C, Wan B/C, FLUX A/B/C and
Qwen-Image B/C, and appends one entry (label, git commit, rows) to ``benchmarks/results/preset_ceiling.json``.
Run from a worktree of an older commit (``git worktree add /tmp/w <commit>``; ``--src /tmp/w/src``) to
measure what a change moved: the simulator is deterministic, so the machine's load does not matter.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "preset_ceiling.json"
CONFIGS = [("hunyuan", "A"), ("hunyuan", "B"), ("hunyuan", "C"), ("wan", "B"), ("wan", "C"),
           ("flux", "A"), ("flux", "B"), ("flux", "C"), ("qwen-image", "B"), ("qwen-image", "C")]
MODES = ("gap_tsp", "gap_tsp_tag", "full")


def measure(src: Path) -> list[dict]:
    sys.path.insert(0, str(src))
    import digenrl
    from digenrl.sim.scenario import Scenario, run_mode
    from digenrl.sim.presets import model_preset, testbed_preset, workload_preset

    if not Path(digenrl.__file__).resolve().is_relative_to(src):
        raise SystemExit(f"--src: imported digenrl from {digenrl.__file__}, not from {src}")

    rows = []
    for model, tb in CONFIGS:
        testbed = testbed_preset(tb)
        s = Scenario(model_preset(model), testbed, workload_preset(model), testbed.total, 20, 0.5)
        co = run_mode(s, "colocated").result
        row = {"model": model, "testbed": tb, "colocated_s": co.step_time}
        for mode in MODES:
            r = run_mode(s, mode)
            res = r.result
            row[mode] = {"step_s": res.step_time, "vs_colocated": co.step_time / res.step_time,
                         "split": [r.n_gen, r.n_train], "fragment": r.plan.fragment_size,
                         "chunk": [r.plan.chunk_generations, r.plan.chunk_timesteps],
                         "gen_idle": res.gen_idle, "trainer_idle": res.trainer_idle,
                         "tag_fragments_per_step": res.tag_fragments_per_step,
                         "tag_copy": bool(getattr(r, "tag_copy", False)),
                         "publish": getattr(r, "publish", "object_store"),
                         "shard_groups": getattr(r, "shard_groups", 1),
                         "stale_hold": getattr(r, "stale_hold", 0.0),
                         "gang_groups": getattr(r, "gang_groups", None)}
        rows.append(row)
        print(f"{model} {tb}: full {row['full']['vs_colocated']:.3f}x colocated", flush=True)
    return rows


def table(entries: list[dict]) -> str:
    head = "| model | testbed | colocated (s) | " + " | ".join(
        f"full, {e['label']}" for e in entries) + " | +TAG over +TSP (last) | idle gen / trainer, full (last) | TAG frags/step (last) | shard groups, full (last) |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    last = entries[-1]
    for i, row in enumerate(last["rows"]):
        cells = [row["model"], row["testbed"], f"{row['colocated_s']:.1f}"]
        cells += [f"{e['rows'][i]['full']['vs_colocated']:.3f}x" for e in entries]
        f, tag, tsp = row["full"], row["gap_tsp_tag"], row["gap_tsp"]
        cells.append(f"{tsp['step_s'] / tag['step_s']:.3f}x" + (" (copy)" if tag["tag_copy"] else ""))
        cells.append(f"{f['gen_idle']:.0%} / {f['trainer_idle']:.0%}")
        cells.append(f"{f['tag_fragments_per_step']:.2f}")
        cells.append(str(f.get("shard_groups", 1)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", help="name of this entry (e.g. the change it measures)")
    ap.add_argument("--src", default=str(ROOT / "src"), help="the src/ of the code to measure")
    ap.add_argument("--table", action="store_true", help="print the results file as a markdown table")
    args = ap.parse_args()
    entries = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    if args.table:
        print(table(entries))
        return 0
    if not args.label:
        ap.error("--label is required to measure")
    src = Path(args.src).resolve()
    commit = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    t0 = time.time()
    rows = measure(src)
    entries = [e for e in entries if e["label"] != args.label] + [
        {"label": args.label, "commit": commit, "seconds": round(time.time() - t0, 1), "rows": rows}]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    tmp = RESULTS.with_suffix(".tmp")
    tmp.write_text(json.dumps(entries, indent=1))
    tmp.replace(RESULTS)
    print(table(entries))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
