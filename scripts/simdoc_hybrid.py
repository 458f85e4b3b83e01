"""The "Hybrid sharding, priced before it is built" section of docs/simulation.md, from
``benchmarks/results/hybrid_whatif.json`` (``benchmarks/hybrid_whatif.py``) only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from hybrid_whatif import table  # noqa: E402


def section(results_dir: Path) -> list[str]:
    path = results_dir / "hybrid_whatif.json"
    if not path.exists():
        return []
    rows = json.loads(path.read_text())["rows"]
    better = [r for r in rows if r["hybrid"] and min(h["step_s"] for h in r["hybrid"]) < r["one_group_s"]]
    return ["## Hybrid sharding, priced before it is built\n",
            "The Ray runtime runs a sharded trainer pool as one shard group. `benchmarks/hybrid_whatif.py` prices k "
            "groups of g = N / k ranks (each a data-parallel replica, its own chunks and TAG gangs of at most g "
            "fragments of one prompt group; the commit all-reduces the gradient shards across the replicas), `full` "
            "mode, exact costs, 20 steps, split searched near the one-group plan. A what-if for planning the work, "
            "not a mode the runtime offers (results in `benchmarks/results/hybrid_whatif.json`).\n",
            table(rows) + "\n",
            f"Hybrid groups are faster on {len(better)} of {len(rows)} configurations: where a prompt group's G "
            "generations fill a g-rank gang (video, G = 12) the TAG gangs stop leaving ranks idle; on the image "
            "models the gain is small or negative (their gangs already fill, and a smaller group gathers less "
            "in parallel).\n"]
