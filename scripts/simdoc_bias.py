"""The "simulator against measured runs" section of docs/simulation.md, from two results files only:

* ``benchmarks/results/pipeline_cpu.json`` (``benchmarks/pipeline_cpu.py``): per mode, measured steady step time,
  the prediction from a profile measured before the run, and from the run's own op costs;
* ``benchmarks/results/plan_validation.json`` (``benchmarks/plan_validation.py``): three ``digenrl plan``
  candidates, predicted vs measured.

Every number in the section is a value of those files.
"""

from __future__ import annotations

import json
from pathlib import Path

from simdoc_render import table


def section(results_dir: Path) -> list[str]:
    pipe, plan = results_dir / "pipeline_cpu.json", results_dir / "plan_validation.json"
    if not pipe.exists():
        return []
    rows = json.loads(pipe.read_text())
    out = ["## The simulator against measured runs (CPU)\n",
           "Before trusting the predictions below, this is how far the simulator is from runs it can be checked "
           "against: the Ray runtime on this project's 2-core CPU machine (`benchmarks/pipeline_cpu.py`, 1 generator "
           "+ 1 trainer rank; step = steady-state step time). `profile` predicts from costs measured on live workers "
           "before the run (mean of 8 repeats per op), `own costs` from the mean op costs the run's own spans showed "
           "(the schedule model's error without the profile's).\n"]
    own = all("sim_own_costs_s" in r for r in rows)
    body = [[r["mode"], f"{r['step_time_s']:.3f}", f"{r['sim_step_time_s']:.3f}", f"{r['sim_error']:+.1%}"]
            + ([f"{r['sim_own_costs_s']:.3f}", f"{r['sim_own_costs_error']:+.1%}"] if own else []) for r in rows]
    head = ["mode", "measured (s)", "profile (s)", "error"] + (["own costs (s)", "error"] if own else [])
    out.append(table(body, head) + "\n")
    errs = [abs(r["sim_error"]) for r in rows]
    text = (f"From the profile the error is {min(errs):.1%}-{max(errs):.1%} in magnitude "
            f"({sum(r['sim_error'] < 0 for r in rows)} of {len(rows)} optimistic)")
    if own:
        oe = [abs(r["sim_own_costs_error"]) for r in rows]
        text += f"; from the run's own op costs at most {max(oe):.1%}"
    rank = lambda key: [r["mode"] for r in sorted(rows, key=lambda r: r[key])]  # noqa: E731
    ok = {k: rank(k) == rank("step_time_s") for k in ["sim_step_time_s"] + (["sim_own_costs_s"] if own else [])}
    text += (f". The measured ranking of the modes is {'' if ok['sim_step_time_s'] else 'not '}reproduced from the "
             "profile" + (f"; from the own costs it is{'' if ok['sim_own_costs_s'] else ' not'}" if own else "")
             + ". Read the roofline predictions below with the profile's bias in mind.\n")
    out.append(text)
    if plan.exists():
        pv = json.loads(plan.read_text())
        body = [[r["plan"], r["label"], f"{r['predicted_step_time_s']:.2f}", f"{r['measured_step_time_s']:.2f}",
                 f"{r['error']:+.0%}"] for r in pv["rows"]]
        out.append("`digenrl plan` on the same machine (`benchmarks/plan_validation.py`): the chosen plan and two "
                   "other candidates of its sweep, run for real; the chosen plan is "
                   f"{pv['chosen_vs_best_measured']:.0%} slower than the fastest measured.\n")
        out.append(table(body, ["plan", "candidate", "predicted (s)", "measured (s)", "error"]) + "\n")
    return out
