"""Why BTS depth rarely matters: the decisions of depth 0 / 2 / 4 and of the greedy rule on the same bubbles.

For every preset and TAG mode of ``bts_quality.py`` (same split rule), the default policy (BTS depth 2) runs
with exact costs; at each of its bubbles the snapshot is also decided by fresh searches of depth 0, 2 and 4
(empty memo, unlimited node budget) and by the greedy rule k = min(idle, pending). Reported per config:
bubbles, the share of bubbles where a choice exists (m = min(idle, pending) > 0), and among those the share
where depth 0 = depth 2, depth 2 = depth 4, BTS (depth 2) = greedy, BTS = 0 (SkipBubble), plus the mean k
of each and the search's nodes; and, at the bubbles where depth 2 skips, whether greedy's k = m would have
delayed the current step's commit by the exact no-TAG-afterwards prediction (``StepModel.predict_commit``,
m vs 0: ``skip_greedy_delays`` of ``skips``, mean delay in seconds). Writes
``benchmarks/results/bts_agreement.json``.

Run: ``python benchmarks/bts_agreement.py [--steps 4] [--out PATH]`` (~5 min on 2 shared cores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

from digenrl.control.loop import run_loop
from digenrl.control.timeline import Timeline
from digenrl.schedule import BTS, BTSConfig, Scheduler
from digenrl.sim.executor import VirtualExecutor
from digenrl.sim.scenario import Scenario, make_cost, run_mode
from digenrl.sim.presets import TESTBEDS, model_preset, workload_preset

from bts_quality import MODES, PRESETS

DEPTHS = (0, 2, 4)


class Recorder:
    """The scheduler's TAG policy (BTS depth 2) with every snapshot it decided kept."""

    def __init__(self, inner: BTS):
        self.inner, self.snaps = inner, []

    @property
    def stats(self):
        return self.inner.stats

    def decide(self, snap):
        self.snaps.append(snap)
        return self.inner.decide(snap)

    def record_commit(self, step, t):
        self.inner.record_commit(step, t)

    def set_cost(self, cost):
        self.inner.set_cost(cost)


def config_agreement(s: Scenario, mode: str) -> dict:
    run = run_mode(s, mode, bts=BTSConfig(policy="bts"))
    cost = make_cost(s, run.candidate, False)
    sched = Scheduler(run.plan, cost, BTSConfig(policy="bts"))
    rec = sched.bts = Recorder(sched.bts)
    run_loop(sched, VirtualExecutor(run.plan, cost), Timeline(run.plan))
    ks: dict[str, list[int]] = {f"d{d}": [] for d in DEPTHS}
    ks["greedy"] = []
    nodes = {f"d{d}": [] for d in DEPTHS}
    skip_delta = []  # where depth 2 skips: exact predicted commit with greedy's k minus with k = 0 (seconds)
    model = BTS(run.plan, cost).model
    for snap in rec.snaps:
        m = min(len(snap.idle), len(snap.pending))
        if m == 0:
            continue
        ks["greedy"].append(m)
        for d in DEPTHS:
            dec = BTS(run.plan, cost, BTSConfig(depth=d, budget_nodes=10 ** 9)).decide(snap)
            ks[f"d{d}"].append(dec.k)
            nodes[f"d{d}"].append(dec.nodes)
        if ks["d2"][-1] == 0:
            skip_delta.append(model.predict_commit(snap, m) - model.predict_commit(snap, 0))
    n = len(ks["greedy"])

    def share(a, b):
        return sum(x == y for x, y in zip(ks[a], ks[b])) / n if n else None

    return {"model": s.model.name, "mode": mode, "gen_gpus": run.n_gen, "bubbles": len(rec.snaps), "choices": n,
            "d0_eq_d2": share("d0", "d2"), "d2_eq_d4": share("d2", "d4"), "d2_eq_greedy": share("d2", "greedy"),
            "d2_skip": sum(k == 0 for k in ks["d2"]) / n if n else None,
            "skips": len(skip_delta), "skip_greedy_delays": sum(d > 0 for d in skip_delta),
            "skip_greedy_delay_mean_s": statistics.fmean(skip_delta) if skip_delta else 0.0,
            "step_time_s": run.result.step_time,
            "mean_k": {k: statistics.fmean(v) if v else 0.0 for k, v in ks.items()},
            "nodes_mean": {k: statistics.fmean(v) if v else 0.0 for k, v in nodes.items()},
            "nodes_max": {k: max(v, default=0) for k, v in nodes.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bts_agreement.json"))
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error(f"--steps: must be >= 1 (got {args.steps})")
    rows, t0 = [], time.perf_counter()
    for model, tb in PRESETS:
        s = Scenario(model_preset(model), TESTBEDS[tb], replace(workload_preset(model)), TESTBEDS[tb].total, steps=args.steps)
        for mode in MODES:
            rows.append({"testbed": tb, **config_agreement(s, mode)})
            r = rows[-1]
            print(f"{model} {tb} {mode}: {r['choices']} choices, d0=d2 {r['d0_eq_d2']:.0%}, d2=d4 {r['d2_eq_d4']:.0%}, "
                  f"d2=greedy {r['d2_eq_greedy']:.0%}, skip {r['d2_skip']:.0%} [{time.perf_counter() - t0:.0f}s]",
                  flush=True)
    tot = sum(r["choices"] for r in rows)
    pooled = {k: sum(r[k] * r["choices"] for r in rows if r["choices"]) / tot
              for k in ("d0_eq_d2", "d2_eq_d4", "d2_eq_greedy", "d2_skip")}
    pooled["skips"] = sum(r["skips"] for r in rows)
    pooled["skip_greedy_delays"] = sum(r["skip_greedy_delays"] for r in rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"steps": args.steps, "rows": rows, "pooled": {"choices": tot, **pooled}}, indent=1))
    print(json.dumps(pooled, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
