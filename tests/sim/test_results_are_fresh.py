"""The simulator's committed results files are this code's output: one run of each, recomputed, equals the
committed figure. The simulator is deterministic (virtual time), so a file that disagrees was written by older
code and the pages rendered from it show figures nobody can regenerate (``benchmarks/results/algorithm_costs.json``
was: every row written on a simulator two rounds old). When this fails, re-run the named script and re-render the
page (docs/benchmarks.md lists both)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def _scenario(model: str, tb: str, **workload):
    from digenrl.sim.presets import model_preset, testbed_preset, workload_preset
    from digenrl.sim.scenario import Scenario

    testbed = testbed_preset(tb)
    return Scenario(model_preset(model), testbed, replace(workload_preset(model), **workload), testbed.total, 20, 0.5)


def _step(setup, mode: str) -> float:
    from digenrl.sim.scenario import run_mode

    return run_mode(setup, mode).result.step_time


def _fresh(committed: float, now: float, script: str) -> None:
    assert now == pytest.approx(committed, rel=1e-9), (
        f"{script} wrote {committed!r}; the simulator now gives {now!r}: re-run `python {script}` and re-render")


def test_algorithm_costs_are_this_simulators():
    from digenrl.sim.algorithms import Algorithm

    rows = json.loads((RESULTS / "algorithm_costs.json").read_text())["rows"]
    row = next(r for r in rows if (r["model"], r["testbed"], r["algorithm"]) == ("flux", "B", "nft"))
    setup = _scenario("flux", "B", sampling_steps=row["T"], algorithm=Algorithm(name="nft"))
    _fresh(row["colocated"]["step_s"], _step(setup, "colocated"), "benchmarks/algorithm_costs.py")


def test_hybrid_sharding_is_this_simulators():
    rows = json.loads((RESULTS / "hybrid_sharding.json").read_text())["rows"]
    row = next(r for r in rows if (r["model"], r["testbed"]) == ("flux", "B"))
    _fresh(row["colocated_s"], _step(_scenario("flux", "B"), "colocated"), "benchmarks/hybrid_sharding.py")


def test_simulation_page_runs_are_this_simulators():
    res = json.loads((ROOT / "docs" / "figures" / "simulation_results.json").read_text())
    run = next(r for r in res["runs"] if (r["model"], r["testbed"], r["T"]) == ("flux", "B", 20))
    row = next(r for r in run["rows"] if r["mode"] == "colocated")
    _fresh(row["step_time_s"], _step(_scenario("flux", "B"), "colocated"), "scripts/make_simulation_doc.py")


def test_where_wins_is_this_simulators():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import where_wins

    from digenrl.sim.baselines import idealised
    from digenrl.sim.presets import model_preset, testbed_preset, workload_preset
    from digenrl.sim.scenario import Scenario

    res = json.loads((RESULTS / "where_wins.json").read_text())
    row = next(r for r in res["rows"] if (r["model"], r["testbed"], r["gpus"]) == ("flux", "B", 8))
    w = workload_preset("flux")
    base = Scenario(model_preset("flux"), testbed_preset("B"), w, 8, res["steps"], 0.5)
    now = where_wins._baseline(base, idealised(w.training))["step_s"]
    _fresh(row["idealised"]["step_s"], now, "benchmarks/where_wins.py")


def test_bts_agreement_is_this_simulators():
    """The step time under BTS depth 2 at the recorded split of one preset of ``bts_agreement.json`` (whose
    decision shares docs/simulation.md quotes beside the BTS depth default; it was written on a simulator whose
    planner split the GPUs otherwise)."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from digenrl.schedule import BTSConfig
    from digenrl.sim.presets import TESTBEDS, model_preset, workload_preset
    from digenrl.sim.scenario import Scenario, run_mode

    res = json.loads((RESULTS / "bts_agreement.json").read_text())
    row = next(r for r in res["rows"] if (r["testbed"], r["mode"]) == ("B", "gap_tsp_tag") and r["model"].startswith("FLUX"))
    s = Scenario(model_preset("flux"), TESTBEDS["B"], workload_preset("flux"), TESTBEDS["B"].total, steps=res["steps"])
    run = run_mode(s, "gap_tsp_tag", gen_gpus=row["gen_gpus"], bts=BTSConfig())  # (the split pinned: seconds)
    _fresh(row["step_time_s"], run.result.step_time, "benchmarks/bts_agreement.py")


@pytest.mark.parametrize("model, tb", [("hunyuan", "A"), ("flux", "B")])
def test_simulation_page_costs_are_this_roofline(model, tb):
    """The page's cost table (``RooflineCost.describe`` at the split, publish path and TAG copy ``full`` chose, as
    ``scripts/simdoc_runs.py`` writes it): every figure recomputed from the committed rows equals the committed one."""
    import math
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    from simdoc_runs import _split_costs

    res = json.loads((ROOT / "docs" / "figures" / "simulation_results.json").read_text())
    committed = next(c for c in res["costs"] if (c["model"], c["testbed"]) == (model, tb))
    run = next(r for r in res["runs"] if (r["model"], r["testbed"], r["T"]) == (model, tb, 20))
    now = _split_costs(model, tb, run["rows"])
    assert now.keys() == committed.keys()
    for k, v in committed.items():
        if isinstance(v, float) and math.isnan(v):
            assert math.isnan(now[k]), k
        elif isinstance(v, float):
            _fresh(v, now[k], f"scripts/make_simulation_doc.py ({k})")
        else:
            assert now[k] == v, k
