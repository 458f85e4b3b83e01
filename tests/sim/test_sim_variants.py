"""The generator-path variants of the where-disaggregation-wins study (compiled, LoRA merged or not), against the
roofline they wrap, each figure from the formula in ``sim.variants``' docstring written out here."""

from __future__ import annotations

from dataclasses import replace

import pytest

from digenrl.sim.scenario import Scenario, run_mode
from digenrl.sim.presets import MODELS, TESTBEDS, WORKLOADS
from digenrl.sim.roofline import RooflineCost
from digenrl.sim.presets import LORA_REPLICATED
from digenrl.sim.variants import COMPILED_SPEEDUP, UNMERGED_LORA_SLOWDOWN, FastGenerators, GeneratorPath


def _roof(colocated=False, lora=False):
    w = replace(WORKLOADS["flux"], training=LORA_REPLICATED) if lora else WORKLOADS["flux"]
    return RooflineCost(MODELS["flux"], w, TESTBEDS["B"], 0 if colocated else 4, 8 if colocated else 4,
                        colocated=colocated)


def test_fast_generators_speed_up_only_the_generator_pools_sampling():
    base = _roof()
    fast = FastGenerators(base, 1.5)
    assert fast.time("denoise", 4, "generator") == pytest.approx(base.time("denoise", 4, "generator") / 1.5)
    assert fast.time("vae_decode", 4, "generator") == pytest.approx(base.time("vae_decode", 4, "generator") / 1.5)
    for op, pool in (("denoise", "trainer"), ("reward", "generator"), ("train_chunk", "trainer")):
        assert fast.time(op, 4, pool) == base.time(op, 4, pool)
    with pytest.raises(ValueError, match="speedup"):
        FastGenerators(base, 0.5)


def test_unmerged_lora_slows_every_worker_that_samples_with_adapters():
    # verl-omni issue 248: a LoRA rollout 28% slower than without LoRA (the unmerged adapter matmuls)
    assert UNMERGED_LORA_SLOWDOWN == pytest.approx(1.28)
    base = _roof(lora=True)
    gen, trn = base.time("denoise", 4, "generator"), base.time("denoise", 4, "trainer")
    unmerged = GeneratorPath(base)
    assert unmerged.time("denoise", 4, "generator") == pytest.approx(1.28 * gen)
    assert unmerged.time("denoise", 4, "trainer") == pytest.approx(1.28 * trn)  # TAG: the training module
    merged = GeneratorPath(base, merged=True)
    assert merged.time("denoise", 4, "generator") == pytest.approx(gen)
    assert merged.time("denoise", 4, "trainer") == pytest.approx(1.28 * trn)  # trainers keep their adapters
    both = GeneratorPath(base, speedup=1.5, merged=True)
    assert both.time("denoise", 4, "generator") == pytest.approx(gen / 1.5)
    assert both.time("vae_decode", 4, "generator") == pytest.approx(base.time("vae_decode", 4, "generator") / 1.5)
    for op in ("train_chunk", "reward", "vae_decode"):  # only the denoising forward carries the adapters
        assert GeneratorPath(base).time(op, 4, "trainer") == base.time(op, 4, "trainer")
    full = _roof()  # no LoRA: nothing to merge
    assert GeneratorPath(full).time("denoise", 4, "generator") == full.time("denoise", 4, "generator")
    col = _roof(colocated=True, lora=True)  # a colocated rank: priced by its baseline, not here
    assert GeneratorPath(col, speedup=2.0).time("denoise", 4, "trainer") == col.time("denoise", 4, "trainer")


def test_the_default_factor_is_xdits_compile_ratio():
    # xDiT docs/performance/flux.md: FLUX.1-dev 1024 px, 28 steps, one H100: 6.71 s eager, 4.30 s compiled
    assert COMPILED_SPEEDUP == pytest.approx(6.71 / 4.30)
    assert FastGenerators(_roof()).speedup == COMPILED_SPEEDUP
    assert FastGenerators(_roof()).merged


def test_a_variant_keeps_the_rooflines_memory_limits_in_the_planner():
    from digenrl.sim.scenario import limits as _limits

    base = _roof()
    assert _limits(FastGenerators(base), WORKLOADS["flux"]) == (base.max_fragment, base.max_chunk)
    s = Scenario(MODELS["flux"], TESTBEDS["B"], WORKLOADS["flux"], 8, 3)
    plain = run_mode(s, "gap_tsp", gen_gpus=2)
    fast = run_mode(replace(s, variant=FastGenerators), "gap_tsp", gen_gpus=2)
    assert fast.result.step_time < plain.result.step_time
