"""The "Per algorithm" section of docs/simulation.md, from ``benchmarks/results/algorithm_costs.json``
(``benchmarks/algorithm_costs.py``) only: every number of the section is a value of that file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from algorithm_costs import table  # noqa: E402


def section(results_dir: Path) -> list[str]:
    path = results_dir / "algorithm_costs.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    rows = data["rows"]
    out = ["## Per algorithm (`train.algorithm`)\n",
           "What each algorithm asks of the hardware (`sim.algorithms`): the trained cells per sample S (MixGRPO: its "
           "window; DiffusionNFT: K freshly noised timesteps), the denoising steps per sample (MixGRPO-Flash: "
           "DPM-Solver++ 2M on a compressed schedule after the window, the mean over a cycle of window positions), "
           "the forwards per trained cell (DiffusionNFT trains CFG-free; `nft` with its default soft old policy adds a "
           "no-grad forward per cell and the copy's updates, `nft_current` is `train.nft_old_policy=current`) and "
           "the bytes each trajectory moves to the "
           f"trainers. Testbed B, exact roofline costs, {data['steps']} steps, split searched per mode "
           "(`benchmarks/algorithm_costs.py`, results in `benchmarks/results/algorithm_costs.json`).\n",
           table(rows) + "\n"]
    notes = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = {r["algorithm"]: r for r in rows if r["model"] == model}
        fast = min(mine.values(), key=lambda r: r["full"]["step_s"])
        best = max(mine.values(), key=lambda r: r["colocated"]["step_s"] / r["full"]["step_s"])
        notes.append(f"{model}: the cheapest step is {fast['algorithm']}'s ({fast['full']['step_s']:.1f} s in full); "
                     f"the pipeline gains most over colocation with {best['algorithm']} "
                     f"({best['colocated']['step_s'] / best['full']['step_s']:.3f}x)")
    out.append("; ".join(notes) + ". A step's cost is not its learning: the per-step reward gain differs by "
               "algorithm (the digits comparison is in docs/algorithms.md where it has been run).\n")
    return out
