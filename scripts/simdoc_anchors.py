"""The "Anchors" section of docs/simulation.md: the simulator's predictions of public GPU figures and their error,
from ``benchmarks/results/anchors.json`` (``benchmarks/anchors.py``) only, read fresh at every render."""

from __future__ import annotations

import json
from pathlib import Path


def section(results_dir: Path) -> list[str]:
    path = results_dir / "anchors.json"
    if not path.exists():
        return []
    res = json.loads(path.read_text())
    tol = res["tolerance"]
    rows = ["| anchor | published | predicted | error | what the source leaves open (this row's reading) | source |",
            "|---|---|---|---|---|---|"]
    for a in res["anchors"]:
        need = a.get("train_efficiency_to_match")
        err = f"{a['error']:+.0%}" + ("" if a["within_tolerance"] else f" (> {tol:.0%}")
        if not a["within_tolerance"]:
            err += f"; train efficiency {need:.2f} would match)" if need else ")"
        rows.append(f"| {a['anchor']} | {a['published']:g} {a['unit']} | {a['predicted']:.3g} {a['unit']} | {err} | "
                    f"{a['unknown'][0]} | {a['source']} |")
    notes = [a["note"] for a in res["anchors"] if a.get("note")]
    slow = [a["train_efficiency_to_match"] for a in res["anchors"] if (a.get("train_efficiency_to_match") or 9) < 1]
    fast = [a["train_efficiency_to_match"] for a in res["anchors"] if (a.get("train_efficiency_to_match") or 0) > 1]
    need = (f"the readings where the model is too fast would need {min(slow):.2f}-{max(slow):.2f} of it"
            + (f", those where it is too slow {min(fast):.2f}-{max(fast):.2f}" if fast else "")
            if slow else "no reading needs less than it")
    return ["## Anchors: public GPU figures predicted\n",
            "`python benchmarks/anchors.py` prices three public figures with the simulator's defaults and writes "
            "`benchmarks/results/anchors.json` (each record holds the configuration assumed, every unknown and "
            "its reading). Error = predicted / published - 1. Where a setting the source does not give moves "
            "the figure past the tolerance, each reading is a row of its own.\n",
            "\n".join(rows) + "\n",
            "Re-fits: " + "; ".join(res["refit"] + notes) + "."
            + " Where the training anchors' readings bracket the published figures the model's training efficiency "
            f"(1.0: training at the fitted inference efficiency, an assumption) is not re-fit; {need}, which one "
            "GPU run of `benchmarks/gpu_acceptance.sh --device` (forward+backward against forward time) can "
            "settle.\n"]
