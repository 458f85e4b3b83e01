"""Cost models: the roofline against hand arithmetic, profiles (schema, interpolation, errors)."""

from __future__ import annotations

import json

import pytest

from digenrl.schedule import Durations, Mode
from digenrl.sim.planner import Scenario, make_plan
from digenrl.sim.presets import MODELS, TESTBEDS, WORKLOADS, tokens_per_sample
from digenrl.control.profile import ProfileCost, ProfileError, load_profile, save_profile, tabulate
from digenrl.sim.roofline import InfeasibleError, RooflineCost


def test_token_counts_from_latent_shapes():
    # HunyuanVideo 848x480x33: (33-1)/4+1 = 9 latent frames of (480/16) x (848/16) = 30 x 53 tokens
    assert tokens_per_sample(MODELS["hunyuan"], WORKLOADS["hunyuan"]) == (9 * 30 * 53, 9)
    assert tokens_per_sample(MODELS["flux"], WORKLOADS["flux"]) == (32 * 32, 1)


def test_forward_flops_by_hand():
    c = RooflineCost(MODELS["flux"], WORKLOADS["flux"], TESTBEDS["B"], 8, 24)
    seq = 1024 + 512
    assert c.fwd_flops == pytest.approx(2 * 12e9 * seq + 4 * 57 * seq ** 2 * 3072)
    # Wan: cross-attention text, CFG -> two forwards per denoising step
    w = RooflineCost(MODELS["wan"], WORKLOADS["wan"], TESTBEDS["B"], 8, 24)
    n = 9 * 30 * 52
    assert w.fwd_flops == pytest.approx(2 * 14e9 * n + 4 * 40 * n ** 2 * 5120 + 4 * 40 * n * 512 * 5120)
    t1 = w.time("denoise", 1, "generator")
    flops = 2 * w.fwd_flops
    assert t1 == pytest.approx(flops / (989e12 * w.eff(2 * n)) + w.eff.overhead_s)


def test_batching_and_packing_pay_off_only_when_compute_is_not_saturated():
    c = RooflineCost(MODELS["flux"], WORKLOADS["flux"], TESTBEDS["A"], 8, 24)
    assert c.time("denoise", 8, "generator") / 8 < c.time("denoise", 1, "generator")
    assert c.time("train_chunk", 4, "trainer") / 4 < c.time("train_chunk", 1, "trainer")
    for op in ("denoise", "train_chunk", "vae_decode", "reward", "transfer"):
        assert c.time(op, 2, "trainer") >= c.time(op, 1, "trainer") > 0


def test_memory_limits():
    with pytest.raises(InfeasibleError, match="GB"):  # 20B: 2P of unsharded grads + shards exceed 48 GB
        RooflineCost(MODELS["qwen-image"], WORKLOADS["qwen-image"], TESTBEDS["A"], 8, 24)
    ok = RooflineCost(MODELS["qwen-image"], WORKLOADS["qwen-image"], TESTBEDS["C"], 4, 12)
    assert ok.max_cells >= 1
    # no room for an inference copy on 48 GB -> TAG gathers per forward and the switch is free
    a = RooflineCost(MODELS["hunyuan"], WORKLOADS["hunyuan"], TESTBEDS["A"], 12, 20)
    assert not a.inference_copy_fits and a.time("tag_switch", 1, "trainer") == 0.0
    c = RooflineCost(MODELS["flux"], WORKLOADS["flux"], TESTBEDS["C"], 4, 12)
    assert c.inference_copy_fits and c.time("tag_switch", 1, "trainer") == pytest.approx(c.gather_s)


def test_heterogeneous_pools_price_each_side_on_its_gpu():
    c = RooflineCost(MODELS["flux"], WORKLOADS["flux"], TESTBEDS["A+C"], 24, 16)
    # L40S (362 TF) generates faster than H20 (148 TF) when compute-bound
    assert c.time("vae_decode", 4, "generator") < c.time("vae_decode", 4, "trainer")


def test_colocated_publish_is_free():
    s = Scenario(MODELS["flux"], TESTBEDS["B"], WORKLOADS["flux"], 8, steps=1)
    cost = RooflineCost(MODELS["flux"], WORKLOADS["flux"], TESTBEDS["B"], 0, 8, colocated=True)
    plan = make_plan(s, Mode.COLOCATED, 0, 8, cost)
    assert Durations(plan, cost).publish() == 0.0 and cost.time("publish", 1, "trainer") > 0


def _profile(ops):
    return {"format": "digenrl-profile", "version": 1, "ops": ops}


ALL = {op: [[1, 0.1]] for op in ("denoise", "vae_decode", "reward", "transfer", "train_chunk", "allreduce",
                                 "optimizer", "publish", "tag_switch")}


def test_profile_interpolation_and_extrapolation():
    p = ProfileCost.from_dict(_profile({**ALL, "denoise": [[3, 2.0], [1, 1.0]], "trainer/denoise": [[2, 0.5]]}))
    assert p.time("denoise", 2, "generator") == pytest.approx(1.5)
    assert p.time("denoise", 5, "generator") == pytest.approx(3.0)    # extrapolated from the last two
    assert p.time("denoise", 1, "trainer") == pytest.approx(0.25)     # single point: proportional
    assert p.time("reward", 4, "generator") == pytest.approx(0.4)
    flat = ProfileCost.from_dict(_profile({**ALL, "denoise": [[1, 1.0], [2, 0.1]]}))
    assert flat.time("denoise", 10, "generator") == 0.0              # clamped at zero


@pytest.mark.parametrize("data, msg", [
    ({"format": "x", "version": 1, "ops": ALL}, "format"),
    (_profile({**ALL, "warp": [[1, 1]]}), "unknown op"),
    (_profile({k: v for k, v in ALL.items() if k != "publish"}), "missing publish"),
    (_profile({**ALL, "denoise": [[1, 1], [1, 2]]}), "duplicate"),
    (_profile({**ALL, "denoise": [[0, 1]]}), "batch > 0"),
    (_profile({**ALL, "denoise": "fast"}), "non-empty list"),
])
def test_profile_errors(data, msg):
    with pytest.raises(ProfileError, match=msg):
        ProfileCost.from_dict(data)


def test_profile_file_round_trip(tmp_path):
    roof = RooflineCost(MODELS["hunyuan"], WORKLOADS["hunyuan"], TESTBEDS["B"], 12, 20)
    path = save_profile(tabulate(roof, (1, 2, 4)), tmp_path / "p.json")
    loaded = load_profile(path)
    assert json.loads(path.read_text())["format"] == "digenrl-profile"
    for op in ("denoise", "train_chunk", "vae_decode"):
        assert loaded.time(op, 2, "trainer") == pytest.approx(roof.time(op, 2, "trainer"))
    assert loaded.time("allreduce", 1, "trainer") == pytest.approx(roof.time("allreduce", 1, "trainer"))
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ProfileError, match="not valid JSON"):
        load_profile(tmp_path / "broken.json")
