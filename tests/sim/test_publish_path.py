"""The planner's publish path (``sim.scenario.PresetSource.values(split, "publish")``): outside TCSS the path of the shortest span by the
cost model, in ``full`` every path simulated (a broadcast the generators join waits for their stale fragments;
a stream lets the trainers go on)."""

from __future__ import annotations

from digenrl.schedule import Durations, Mode
from dataclasses import replace

from digenrl.sim import presets
from digenrl.sim.presets import PUBLISH_PATHS
from digenrl.sim.scenario import PresetSource, Scenario, run_mode, split_options


def _build(setup, mode, split, path):
    src = PresetSource(setup, mode)
    return src.build(replace(src.start(split), publish=path))


def publish_paths(setup, mode, split):
    return PresetSource(setup, mode).values(split, "publish")


def _setup(model="flux", tb="B", steps=3):
    testbed = presets.testbed_preset(tb)
    return Scenario(presets.model_preset(model), testbed, presets.WORKLOADS[model], testbed.total, steps, 0.5)


def _publish_span(setup, mode, split, path):
    """From the final commit's end to the generators holding the version: the publish, and for a stream the
    trainers' sends, which the final commit carries."""
    cost, plan = _build(setup, mode, split, path)
    d = Durations(plan, cost)
    return d.publish() + d.commit(final=True) - d.commit(final=False)


def test_outside_tcss_the_shortest_path_alone_is_tried():
    s = _setup()
    split = [o for o in split_options(s) if o.n_gen == 8][0]
    spans = {p: _publish_span(s, Mode.GAP_TSP_TAG, split, p) for p in PUBLISH_PATHS}
    # FLUX, full fine-tuning on testbed B (24 GB of bf16 weights, 24 sharded trainer ranks, 400 Gb/s links):
    # through host memory and the object store vs a link-rate broadcast, each after the shard group's gather
    # of the full state, vs every rank streaming its own 1/24 (no gather). The 24 trainer ranks fill 3 HGX nodes
    # (slots 0-23), so the gather runs at 8 NICs' rate per node (8 x 50 GB/s, under NVLink's 450 GB/s one way)
    b, net, n = 2 * presets.model_preset("flux").archi.params, presets.testbed_preset("B").net_bytes_s, 24
    bus = min(450e9, 8 * net)
    assert spans["broadcast"] < spans["object_store"] / 3
    assert abs((spans["broadcast"] - spans["stream"]) - (b * (n - 1) / n / bus - b / n / net - 1e-3)) < 1e-9
    for mode in (Mode.GAP_TSP, Mode.GAP_TSP_TAG, Mode.NAIVE):
        assert publish_paths(s, mode, split) == ["stream"]
    assert publish_paths(s, Mode.FULL, split) == list(PUBLISH_PATHS)
    assert len(publish_paths(s, Mode.COLOCATED, split)) == 1  # (no publish: not searched)


def test_joined_publish_in_the_plan_and_the_run():
    # the split the whole search picks here (4 generators + 28 trainer ranks in one shard group: 37 s of search),
    # pinned; the planner still chooses the publish path (and copy, fragment size) for it
    r = run_mode(_setup(), "gap_tsp_tag", gen_gpus=4, shard_groups=1)
    assert r.publish == "stream" and r.plan.publish_joins and r.plan.publish_streams
    # the chosen plan's publish holds the generators for the stream's receive, not the trainers
    cost, plan = PresetSource(_setup(), Mode.GAP_TSP_TAG).build(r.candidate)
    pubs = [sp for sp in r.result.spans if sp.kind == "publish"]
    assert pubs and {sp.worker for sp in pubs} == set(r.plan.generators)
    assert all(abs((sp.end - sp.start) - Durations(plan, cost).publish()) < 1e-9 for sp in pubs)
    co = run_mode(_setup(), "colocated")
    assert co.publish == "" and not co.plan.publish_joins
