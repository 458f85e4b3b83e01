"""The test suite's time on two versions of the code, one after the other in one session (issue 37: "the suite's
time does not grow").

Runs each tree's own ``make test`` (its Makefile's pytest command: 2 xdist workers, whole files per worker) with
this checkout's virtual environment and the tree's ``src/`` first on ``PYTHONPATH``, and pytest's JUnit report
of every test's time (setup, call and teardown). A suite's wall time moves with the machine's load and the day
(one minute or more between two CIs of the same commit on this project's 2-core machines), and a suite gains the
tests of whatever landed in between, so the comparison that says whether the code made the suite slower is the
time of the tests both versions have, side by side:

    common tests:  sum over tests t in both of time_new(t)  /  sum over the same t of time_old(t)

next to each suite's wall time and the time of the tests only one version has. A test is the same test when its
module and name are (a renamed or moved test counts as one removed and one added).

    git worktree add /tmp/old <commit>
    python benchmarks/suite_time.py --old /tmp/old [--order old-new] [--out ...]
    python benchmarks/suite_time.py --old /tmp/old --order new-old --append   # a second pair, the other way round

A drift of the machine's speed over the session reads as a difference between the two runs of one pair; a pair in
each order cancels it, so the results give each pair's ratio and their geometric mean.

Writes ``benchmarks/results/suite_time.json`` (the JUnit reports are not kept: the file holds what the comparison
needs). Takes two whole suites (about 35 minutes on 2 cores): run it alone.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commit(tree: Path) -> str:
    out = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "?"


def read_junit(path: Path) -> tuple[dict[tuple[str, str], float], dict]:
    """``{(module, test name): seconds}`` of a JUnit report, and its counts (tests, failures, errors, skipped)."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    times = {(tc.get("classname", ""), tc.get("name", "")): float(tc.get("time", 0.0))
             for s in suites for tc in s.iter("testcase")}
    return times, counts


def run_suite(tree: Path, venv: Path, junit: Path, log: Path) -> dict:
    """``make test`` of ``tree``: its wall time, the 1-min load average before it, and its JUnit report's
    counts and per-test times."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src"),
           "PYTEST_ADDOPTS": f"--junitxml={junit} -p no:cacheprovider"}
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.run(["make", "-C", str(tree), "test", f"VENV={venv}"], env=env, stdout=f,
                              stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    if not junit.exists():
        raise RuntimeError(f"{tree}: make test wrote no JUnit report (exit {proc.returncode}); see {log}")
    times, counts = read_junit(junit)
    return {"wall_s": wall, "exit": proc.returncode, "loadavg_1min_before": load, **counts, "times": times}


def compare(old: dict[tuple[str, str], float], new: dict[tuple[str, str], float], top: int = 8) -> dict:
    """The common tests' sums and ratio, the tests only one side has, and the modules whose common tests moved
    most (new - old seconds), both ways."""
    common = old.keys() & new.keys()
    by_mod_old, by_mod_new, only_new = collections.Counter(), collections.Counter(), collections.Counter()
    for k in common:
        by_mod_old[k[0]] += old[k]
        by_mod_new[k[0]] += new[k]
    only_old = old.keys() - new.keys()
    for k in new.keys() - old.keys():
        only_new[k[0]] += new[k]
    moved = sorted(by_mod_old, key=lambda m: by_mod_new[m] - by_mod_old[m])

    def row(m: str) -> dict:
        return {"module": m, "old_s": round(by_mod_old[m], 1), "new_s": round(by_mod_new[m], 1)}

    c_old, c_new = sum(old[k] for k in common), sum(new[k] for k in common)
    return {"common_tests": len(common), "common_old_s": c_old, "common_new_s": c_new,
            "common_new_over_old": c_new / c_old if c_old else float("nan"),
            "only_old_tests": len(only_old), "only_old_s": sum(old[k] for k in only_old),
            "only_new_tests": len(new) - len(common), "only_new_s": sum(only_new.values()),
            "faster": [row(m) for m in moved[:top] if by_mod_new[m] < by_mod_old[m]],
            "slower": [row(m) for m in reversed(moved[-top:]) if by_mod_new[m] > by_mod_old[m]],
            "only_new_by_module": [{"module": m, "s": round(s, 1)} for m, s in only_new.most_common(top)]}


def pair_text(res: dict) -> tuple[str, str]:
    """One pair's table rows and sentence."""
    c = res["comparison"]
    rows = []
    for name in res["order"].split("-"):
        r = res["runs"][name]
        rows.append(f"| {name} | `{res[name + '_commit']}` | {r['tests']} ({r['failures'] + r['errors']}) | "
                    f"{r['wall_s'] / 60:.1f} min | {r['sum_s']:.0f} s | {r['loadavg_1min_before']:.2f} |")
    slower = ", ".join(f"`{m['module']}` {m['old_s']:.0f} -> {m['new_s']:.0f} s" for m in c["slower"][:3]) or "none"
    added = ", ".join(f"`{m['module']}` {m['s']:.0f} s" for m in c["only_new_by_module"][:3])
    return ("\n".join(rows), f"the {c['common_tests']} tests both have took {c['common_old_s']:.0f} s (old) and "
            f"{c['common_new_s']:.0f} s (new): new / old = **{c['common_new_over_old']:.3f}**. The "
            f"{c['only_new_tests']} tests only the new code has add {c['only_new_s']:.0f} s (most: {added}); the "
            f"{c['only_old_tests']} only the old one had took {c['only_old_s']:.0f} s. Common tests that got slower, "
            f"by module: {slower}.")


def summary(pairs: list[dict]) -> dict:
    """The pairs' common-test ratios and their geometric mean (a pair in each order cancels a drift of the
    machine's speed over the session, which a single pair reads as a difference of the code)."""
    ratios = [p["comparison"]["common_new_over_old"] for p in pairs]
    return {"ratios": ratios, "geometric_mean": math.prod(ratios) ** (1 / len(ratios)),
            "orders": [p["order"] for p in pairs]}


def markdown(res: dict) -> str:
    """The side-by-side tables of a results file (``scripts/benchmarks_doc.py`` block ``suite_time``)."""
    out = []
    for i, pair in enumerate(res["pairs"], 1):
        rows, text = pair_text(pair)
        out.append(f"Pair {i} ({pair['order']}, {pair['cpus']} CPUs):\n\n| code | commit | tests (failed) | wall time | "
                   f"sum of test times | 1-min load before |\n|---|---|---|---|---|---|\n{rows}\n\nIn pair {i}, {text}")
    sm = res["summary"]
    if len(sm["ratios"]) > 1:
        out.append(f"The common tests' new / old over the {len(sm['ratios'])} pairs "
                   f"({', '.join(f'{r:.3f}' for r in sm['ratios'])}): geometric mean **{sm['geometric_mean']:.3f}**.")
    return "\n\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="the earlier source tree (a git worktree of an earlier commit)")
    ap.add_argument("--new", default=str(ROOT), help="the later source tree (default: this checkout)")
    ap.add_argument("--order", choices=["old-new", "new-old"], default="old-new")
    ap.add_argument("--append", action="store_true",
                    help="add this pair to the pairs already in --out (run the other --order the second time)")
    ap.add_argument("--venv", default=str(ROOT / ".venv"), help="the virtual environment both suites run in")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "suite_time.json"))
    args = ap.parse_args(argv)
    trees = {"old": Path(args.old).resolve(), "new": Path(args.new).resolve()}
    venv, out_path = Path(args.venv).resolve(), Path(args.out)
    for name, tree in trees.items():
        if not (tree / "src" / "digenrl").is_dir() or not (tree / "Makefile").is_file():
            ap.error(f"--{name}: {tree} has no src/digenrl or no Makefile (give a source tree of DigenRL)")
    if not (venv / "bin" / "python").exists():
        ap.error(f"--venv: {venv} has no bin/python (run make setup)")
    pairs = []
    commits = {name: _commit(tree) for name, tree in trees.items()}
    if args.append:
        try:
            pairs = json.loads(out_path.read_text())["pairs"]
        except (OSError, ValueError, KeyError) as e:
            ap.error(f"--append: {out_path} holds no pairs to add to ({e})")
        theirs = {(p["old_commit"], p["new_commit"]) for p in pairs}
        if theirs != {(commits["old"], commits["new"])}:  # (a mean over pairs of other commits measures nothing)
            ap.error(f"--append: {out_path} holds pairs of {sorted(theirs)} (old, new), not of "
                     f"{(commits['old'], commits['new'])}; give those trees, or another --out")
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.order.split("-"):
            print(f"{name} ({commits[name]}): make test ...", flush=True)
            runs[name] = run_suite(trees[name], venv, Path(tmp) / f"{name}.xml", Path(tmp) / f"{name}.log")
            r = runs[name]
            print(f"{name}: {r['tests']} tests, {r['failures'] + r['errors']} failed, {r['wall_s'] / 60:.1f} min "
                  f"(load before {r['loadavg_1min_before']:.2f})", flush=True)
    times = {k: runs[k].pop("times") for k in runs}
    for k in runs:
        runs[k]["sum_s"] = sum(times[k].values())
    pairs.append({"old_commit": commits["old"], "new_commit": commits["new"], "order": args.order,
                  "cpus": os.cpu_count(), "runs": runs, "comparison": compare(times["old"], times["new"])})
    out = {"pairs": pairs, "summary": summary(pairs)}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=1))
    print(markdown(out))
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
