"""The planner's pick at the run's length (``sim.planner``, ``run_steps``): a plan simulated for K steps reports
makespan / K, and a short probe's steady figure can rank the candidates otherwise (TCSS's pipeline fill, its
periodic stale pattern, the last step). The pick is then never slower over the run than a candidate the search
probed. Oracle: every probe's plan simulated in full for the run's K steps (``simulate``)."""

from __future__ import annotations

from dataclasses import replace

from digenrl.sim import presets
from digenrl.sim.executor import simulate
from digenrl.sim.planner import Split
from digenrl.sim.scenario import PresetSource, Scenario, run_mode


def test_the_pick_is_not_slower_over_the_run_than_any_probed_candidate():
    """Wan2.1-T2V-14B, testbed B, ``full``, split 8+24, 20 steps: the 8-step probes rank first a candidate
    (fragment 3, 3 shard groups) whose first step is long and whose steps then run fast while the fill's
    next-step fragments last; over the 20 steps it is slower than others the search probed. The pick is the
    fastest of them over the run (before: the fastest probe, 678.5 s against 656.2 s)."""
    tb = presets.testbed_preset("B")
    s = Scenario(presets.model_preset("wan"), tb, presets.workload_preset("wan"), tb.total, 20, 0.5)
    split = Split(8, 24, tb.gpu, tb.gpu)
    r = run_mode(s, "full", split=split)
    src = PresetSource(s, "full", split=split)
    over_run = {}
    for p in r.search.probes:
        cost, plan = src.build(p.candidate)
        over_run[p.candidate] = simulate(replace(plan, steps=s.steps), cost, record=False).step_time
    fastest_probe = min(r.search.probes, key=lambda p: p.step_time)
    assert r.result.step_time == over_run[r.candidate]  # the run is the pick's run
    assert r.result.step_time <= min(over_run.values())
    assert r.result.step_time < over_run[fastest_probe.candidate]  # the case has teeth: the probes alone
    assert fastest_probe.candidate != r.candidate                  # rank a slower candidate first
