"""The "Hybrid sharding, per shard-group count" section of docs/simulation.md, from
``benchmarks/results/hybrid_sharding.json`` (``benchmarks/hybrid_sharding.py``) only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from hybrid_sharding import table  # noqa: E402


def section(results_dir: Path) -> list[str]:
    path = results_dir / "hybrid_sharding.json"
    if not path.exists():
        return []
    rows = json.loads(path.read_text())["rows"]
    one = {(r["model"], r["testbed"]): next((h for h in r["per_k"] if h["k"] == 1), None) for r in rows}
    better = [r for r in rows if one[(r["model"], r["testbed"])] is not None
              and min(h["step_s"] for h in r["per_k"]) < one[(r["model"], r["testbed"])]["step_s"] - 1e-9]
    picked = [r for r in rows if r["planner"]["k"] > 1]
    return ["## Hybrid sharding, per shard-group count\n",
            "The runtime shards the trainer pool into k groups of g = N / k ranks (`train.shard_groups`; each group "
            "a data-parallel replica with its own chunks and TAG gangs of at most g fragments, of one or several prompt groups; "
            "the commit all-reduces the gradient shards across the replicas), and the planner searches k "
            "(an axis of `sim.planner`, k <= 6). `benchmarks/hybrid_sharding.py` runs the planner with each k "
            "pinned, `full` mode, exact costs, 20 steps (results in `benchmarks/results/hybrid_sharding.json`); "
            "the last columns are the planner's own pick (k searched with the other axes by its probes, 8 steps "
            "each in `full`, the pick the fastest over the run's 20 steps of the candidates it probed) against "
            "one group.\n",
            table(rows) + "\n",
            f"Some k > 1 is faster than one group on {len(better)} of {len(rows)} configurations, and the planner "
            f"picks k > 1 on {len(picked)}. " + (
                "A gang that keeps to one prompt group leaves ranks idle where G generations do not fill the "
                "group's ranks, and several smaller groups then pay; a gang across prompt groups "
                "(`tuning.gang_groups`) fills every rank of one large group whatever G, which leaves the "
                "replicas only their costs (the all-reduce across them at the commit, and each group's "
                "parameter gathers over fewer ranks)." if not better else
                "Where a group's gangs leave ranks idle the groups train chunks side by side; elsewhere a "
                "smaller group gathers less in parallel and the replicas all-reduce at the commit.") + "\n"]
