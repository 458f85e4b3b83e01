"""The "simulator against measured runs" section of docs/simulation.md, from two results files only:

* ``benchmarks/results/pipeline_cpu.json`` (``benchmarks/pipeline_cpu.py``): per mode, measured steady step time,
  the predictions from the run's pre-run calibration, from its first step's spans and from its own op costs;
* ``benchmarks/results/plan_validation.json`` (``benchmarks/plan_validation.py``): three ``digenrl plan``
  candidates, predicted vs measured.

Every number in the section is a value of those files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from simdoc_render import table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from pipeline_cpu import distinguishable_pairs, ordered_as_measured, ranks_as_measured  # noqa: E402
from plan_validation import table_cells  # noqa: E402


def section(results_dir: Path) -> list[str]:
    pipe, plan = results_dir / "pipeline_cpu.json", results_dir / "plan_validation.json"
    if not pipe.exists():
        return []
    rows = json.loads(pipe.read_text())
    n = rows[0].get("rounds", 1)
    out = ["## The simulator against measured runs (CPU)\n",
           "Before trusting the predictions below, this is how far the simulator is from runs it can be checked "
           "against: the Ray runtime on this project's 2-core CPU machine (`benchmarks/pipeline_cpu.py`, 1 generator "
           f"+ 1 trainer rank; step = steady-state step time; every number the mean of {n} interleaved runs per "
           "mode). Three sources of op costs: `calibration`, timed on the run's own workers just before its first "
           "step (mean of 8 repeats per op); `step-1 costs`, the spans of the run's first step (before the measured "
           "window: what `profile_observed.json` of an earlier run gives); `own costs`, the spans of the whole run "
           "(the schedule model's error without any error in the costs).\n"]
    cols = [("sim_step_time_s", "sim_error", "calibration"), ("sim_step1_s", "sim_step1_error", "step-1 costs"),
            ("sim_own_costs_s", "sim_own_costs_error", "own costs")]
    cols = [c for c in cols if all(c[0] in r for r in rows)]
    body = [[r["mode"], f"{r['step_time_s']:.3f}"] + [f"{r[k]:.3f} ({r[e]:+.1%})" for k, e, _ in cols]
            + [" / ".join(f"{x:+.0%}" for x in r.get("round_errors", []))] for r in rows]
    head = ["mode", "measured (s)"] + [f"{name} (s)" for _, _, name in cols] + ["calibration, per run"]
    out.append(table(body, head) + "\n")
    parts = []
    for k, e, name in cols:
        errs = [abs(r[e]) for r in rows]
        parts.append(f"from the {name} at most {max(errs):.1%} off ({sum(r[e] < 0 for r in rows)} of {len(rows)} "
                     f"optimistic), ranking {'equal to' if ranks_as_measured(rows, k) else 'not'} "
                     "the measured one")
    spread = [abs(x) for r in rows for x in r.get("round_errors", [])]
    text = "Averaged over the runs, the simulator is " + "; ".join(parts) + "."
    pairs = distinguishable_pairs(rows)
    if pairs is not None:
        text += (f" Only {len(pairs)} of the {len(rows) * (len(rows) - 1) // 2} pairs of modes differ by more than twice "
                 "the standard error of their measured means, so only these have a measured order; of them the "
                 "simulator orders as measured " + ", ".join(
                     f"{ordered_as_measured(pairs, k)} from the {name}"
                     for k, _, name in cols) + ".")
    if spread:
        text += (f" A single run against its own calibration is up to {max(spread):.0%} off: this VM's speed drifts "
                 "by that much between the calibration and the run (the same op's cost moves as much between two "
                 "runs minutes apart), and the mean of a few interleaved runs is the comparison that measures the "
                 "simulator rather than the drift.")
    out.append(text + " Read the roofline predictions below with this bias in mind.\n")
    if plan.exists():
        pv = json.loads(plan.read_text())
        head, body = table_cells(pv)
        rounds = f", the mean of {pv['rounds']} interleaved runs each" if "rounds" in pv else ""
        out.append("`digenrl plan` on the same machine (`benchmarks/plan_validation.py`): the chosen plan and two "
                   f"other candidates of its sweep, run for real{rounds}; the chosen plan is "
                   f"{pv['chosen_vs_best_measured']:.0%} slower than the fastest measured.\n")
        out.append(table(body, head) + "\n")
    return out
