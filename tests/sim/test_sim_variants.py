"""The named cost variants of the where-disaggregation-wins study, against the roofline they wrap."""

from __future__ import annotations

from dataclasses import replace

import pytest

from digenrl.sim.planner import Scenario, run_mode
from digenrl.sim.presets import MODELS, TESTBEDS, WORKLOADS
from digenrl.sim.roofline import RooflineCost
from digenrl.sim.variants import FastGenerators, PeerColocated


def _roof(colocated=False):
    return RooflineCost(MODELS["flux"], WORKLOADS["flux"], TESTBEDS["B"], 0 if colocated else 4, 8 if colocated else 4,
                        colocated=colocated)


def test_peer_colocated_trains_one_cell_per_forward_backward():
    base = _roof(colocated=True)
    peer = PeerColocated(base)
    for c in (1, 5, 16):
        assert peer.time("train_chunk", c, "trainer") == pytest.approx(c * base.time("train_chunk", 1, "trainer"))
    assert base.time("train_chunk", 16, "trainer") < 16 * base.time("train_chunk", 1, "trainer")  # packing pays
    for op in ("denoise", "vae_decode", "optimizer"):
        assert peer.time(op, 4, "trainer") == base.time(op, 4, "trainer")


def test_fast_generators_speed_up_only_the_generator_pools_sampling():
    base = _roof()
    fast = FastGenerators(base, 1.5)
    assert fast.time("denoise", 4, "generator") == pytest.approx(base.time("denoise", 4, "generator") / 1.5)
    assert fast.time("vae_decode", 4, "generator") == pytest.approx(base.time("vae_decode", 4, "generator") / 1.5)
    for op, pool in (("denoise", "trainer"), ("reward", "generator"), ("train_chunk", "trainer")):
        assert fast.time(op, 4, pool) == base.time(op, 4, pool)
    with pytest.raises(ValueError, match="factor"):
        FastGenerators(base, 0.5)


def test_a_variant_keeps_the_rooflines_memory_limits_in_the_planner():
    s = Scenario(MODELS["flux"], TESTBEDS["B"], WORKLOADS["flux"], 8, 3)
    plain = run_mode(s, "colocated")
    peer = run_mode(replace(s, variant=PeerColocated), "colocated")
    assert peer.plan.fragment_size == plain.plan.fragment_size  # chosen within the same memory cap
    assert peer.result.step_time > plain.result.step_time
