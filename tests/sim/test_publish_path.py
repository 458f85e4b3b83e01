"""The planner's publish path (``sim.planner.publish_paths``): outside TCSS the cheaper path by the cost model,
in ``full`` both simulated (a broadcast the generators join waits for their stale fragments)."""

from __future__ import annotations

from digenrl.schedule import Durations, Mode
from digenrl.sim.planner import PUBLISH_PATHS, Scenario, _build, publish_paths, run_mode, split_options
from digenrl.sim import presets


def _setup(model="flux", tb="B", steps=3):
    testbed = presets.testbed_preset(tb)
    return Scenario(presets.model_preset(model), testbed, presets.WORKLOADS[model], testbed.total, steps, 0.5)


def _publish_seconds(setup, mode, split, path):
    cost, plan = _build(setup, mode, split, None, None, path)
    return Durations(plan, cost).publish()


def test_outside_tcss_the_cheaper_path_alone_is_tried():
    s = _setup()
    split = [o for o in split_options(s) if o.n_gen == 8][0]
    priced = {p: _publish_seconds(s, Mode.GAP_TSP_TAG, split, p) for p in PUBLISH_PATHS}
    # FLUX, full fine-tuning on testbed B: 24 GB through host memory and the object store vs a link-rate broadcast
    assert priced["broadcast"] < priced["object_store"] / 3
    for mode in (Mode.GAP_TSP, Mode.GAP_TSP_TAG, Mode.NAIVE):
        assert publish_paths(s, mode, split, None) == ["broadcast"]
    assert publish_paths(s, Mode.FULL, split, None) == list(PUBLISH_PATHS)
    assert publish_paths(s, Mode.COLOCATED, split, None) == [None]


def test_joined_publish_in_the_plan_and_the_run():
    r = run_mode(_setup(), "gap_tsp_tag")
    assert r.publish == "broadcast" and r.plan.publish_joins
    # the chosen plan's publish is the broadcast's price, not the object store's
    pubs = [sp for sp in r.result.spans if sp.kind == "publish" and sp.worker == r.plan.trainers[0]]
    cost, plan = _build(_setup(), Mode.GAP_TSP_TAG, r.split, r.plan.fragment_size, r.tag_copy, "broadcast")
    assert pubs and abs((pubs[0].end - pubs[0].start) - Durations(plan, cost).publish()) < 1e-9
    co = run_mode(_setup(), "colocated")
    assert co.publish == "" and not co.plan.publish_joins
