"""The generator-speed variant of the where-disaggregation-wins study, against the roofline it wraps."""

from __future__ import annotations

from dataclasses import replace

import pytest

from digenrl.sim.planner import Scenario, run_mode
from digenrl.sim.presets import MODELS, TESTBEDS, WORKLOADS
from digenrl.sim.roofline import RooflineCost
from digenrl.sim.variants import COMPILED_SPEEDUP, FastGenerators


def _roof(colocated=False):
    return RooflineCost(MODELS["flux"], WORKLOADS["flux"], TESTBEDS["B"], 0 if colocated else 4, 8 if colocated else 4,
                        colocated=colocated)


def test_fast_generators_speed_up_only_the_generator_pools_sampling():
    base = _roof()
    fast = FastGenerators(base, 1.5)
    assert fast.time("denoise", 4, "generator") == pytest.approx(base.time("denoise", 4, "generator") / 1.5)
    assert fast.time("vae_decode", 4, "generator") == pytest.approx(base.time("vae_decode", 4, "generator") / 1.5)
    for op, pool in (("denoise", "trainer"), ("reward", "generator"), ("train_chunk", "trainer")):
        assert fast.time(op, 4, pool) == base.time(op, 4, pool)
    with pytest.raises(ValueError, match="factor"):
        FastGenerators(base, 0.5)


def test_the_default_factor_is_xdits_compile_ratio():
    # xDiT docs/performance/flux.md: FLUX.1-dev 1024 px, 28 steps, one H100: 6.71 s eager, 4.30 s compiled
    assert COMPILED_SPEEDUP == pytest.approx(6.71 / 4.30)
    assert FastGenerators(_roof()).factor == COMPILED_SPEEDUP


def test_a_variant_keeps_the_rooflines_memory_limits_in_the_planner():
    from digenrl.sim.planner import _limits

    base = _roof()
    assert _limits(FastGenerators(base), WORKLOADS["flux"]) == (base.max_fragment, base.max_chunk)
    s = Scenario(MODELS["flux"], TESTBEDS["B"], WORKLOADS["flux"], 8, 3)
    plain = run_mode(s, "gap_tsp", gen_gpus=2)
    fast = run_mode(replace(s, variant=FastGenerators), "gap_tsp", gen_gpus=2)
    assert fast.result.step_time < plain.result.step_time
