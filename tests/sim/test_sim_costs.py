"""Cost models: the roofline against hand arithmetic, profiles (schema, interpolation, errors)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from digenrl.schedule import Durations, Mode
from digenrl.sim.planner import Candidate, Split
from digenrl.sim.scenario import Scenario, make_plan
from digenrl.sim.presets import MODELS, TESTBEDS, WORKLOADS, tokens_per_sample
from digenrl.control.profile import ProfileCost, ProfileError, load_profile, save_profile
from tabulated_profile import tabulate
from digenrl.sim.roofline import InfeasibleError, RooflineCost


def test_token_counts_from_latent_shapes():
    # HunyuanVideo 848x480x33: (33-1)/4+1 = 9 latent frames of (480/16) x (848/16) = 30 x 53 tokens
    assert tokens_per_sample(MODELS["hunyuan_video"], WORKLOADS["hunyuan_video"]) == (9 * 30 * 53, 9)
    assert tokens_per_sample(MODELS["flux"], WORKLOADS["flux"]) == (32 * 32, 1)


def test_forward_flops_are_per_stream_and_denoise_prices_them():
    from digenrl.models.specs import SPECS

    ARCHS = {k: s.arch for k, s in SPECS.items()}

    c = RooflineCost(MODELS["flux"], WORKLOADS["flux"], TESTBEDS["B"], 8, 24)
    a, s = ARCHS["flux"], ARCHS["flux"].streams
    n_img, n_txt = 1024, 512
    by_hand = (2 * (s.img * n_img + s.txt * n_txt + s.joint * (n_img + n_txt) + s.sample)
               + 4 * 57 * (n_img + n_txt) ** 2 * 3072)
    assert c.fwd_flops == pytest.approx(by_hand)
    assert c.fwd_flops < 0.6 * 2 * a.params * (n_img + n_txt)       # 2 P seq overcounts FLUX ~1.8x
    # Wan: cross-attention text, CFG -> two forwards per denoising step
    w = RooflineCost(MODELS["wan"], WORKLOADS["wan"], TESTBEDS["B"], 8, 24)
    n = 9 * 30 * 52
    sw = ARCHS["wan"].streams
    fwd = 2 * (sw.img * n + sw.txt * 512 + sw.sample) + 4 * 40 * n ** 2 * 5120 + 4 * 40 * n * 512 * 5120
    assert w.fwd_flops == pytest.approx(fwd)
    eff = w.effs["generator"]
    t1 = w.time("denoise", 1, "generator")
    assert t1 == pytest.approx(2 * fwd / (989e12 * eff.plateau * 2 * n / (2 * n + 512)) + eff.overhead_s)


def test_training_flops_full_vs_lora():
    from digenrl.sim.presets import LORA_REPLICATED, Training

    full = RooflineCost(MODELS["flux"], WORKLOADS["flux"], TESTBEDS["B"], 8, 24)
    lora = RooflineCost(MODELS["flux"], replace(WORKLOADS["flux"], training=LORA_REPLICATED), TESTBEDS["B"], 8, 24)
    F, lin = full.fwd_flops, full.fwd_linear
    A = F - lin  # attention: its backward costs 2.5x its forward (FlashAttention-2), the linears' input grads 1x
    assert full.train_flops_per_cell() == pytest.approx(F + (lin + 2.5 * A) + lin + F)  # fwd, bwd, weights, recompute
    assert lora.train_flops_per_cell() == pytest.approx(F + (lin + 2.5 * A) + F)        # no base weight gradients
    norec = RooflineCost(MODELS["flux"], replace(WORKLOADS["flux"], training=Training(recompute=False)),
                         TESTBEDS["B"], 8, 24)
    assert norec.train_flops_per_cell() == pytest.approx(F + lin + 2.5 * A + lin) and norec.max_cells < full.max_cells


def test_publish_object_store_and_lora_sizes():
    from digenrl.models.specs import SPECS

    ARCHS = {k: s.arch for k, s in SPECS.items()}
    from digenrl.sim.presets import LORA_REPLICATED, Training
    from digenrl.sim.roofline import HOST_COPY_GBS

    tb = TESTBEDS["B"]
    c = RooflineCost(MODELS["hunyuan_video"], WORKLOADS["hunyuan_video"], tb, 12, 20)
    b = 2 * ARCHS["hunyuan_video"].params
    net = 400e9 / 8
    # the 20 trainer ranks sit on slots 0-19: 8 + 8 + 4 per HGX node, so a ring over them runs at the slowest
    # node's 4 NICs (4 x 50 GB/s, under NVLink's 450 GB/s one way); the 12 generators on nodes 2 and 3
    bus = min(450e9, 4 * net)
    # the 20-rank shard group gathers the full state (as the runtime's full_trainable_state does), then rank 0
    # -> host (PCIe 5: 64 GB/s), put (host copy), 2 generator nodes fetch one after another, load
    gather = b * 19 / 20 / bus
    expect = gather + b / 64e9 + b / (HOST_COPY_GBS * 1e9) + 2 * b / net + b / 64e9 + 0.01
    assert c.time("publish", 1, "trainer") == pytest.approx(expect)
    bc = RooflineCost(MODELS["hunyuan_video"], replace(WORKLOADS["hunyuan_video"], training=Training(publish="broadcast")),
                      tb, 12, 20)
    assert bc.time("publish", 1, "trainer") == pytest.approx(gather + b / net + b / 3350e9 + 0.01)
    # stream: each of the 20 ranks sends its 1/20 (the trainers' part); the generators receive all b and load it
    st = RooflineCost(MODELS["hunyuan_video"], replace(WORKLOADS["hunyuan_video"], training=Training(publish="stream")),
                      tb, 12, 20)
    assert st.time("publish", 1, "trainer") == pytest.approx(b / 20 / net + 1e-3)
    assert st.time("publish", 1, "generator") == pytest.approx(b / net + b / 3350e9 + 0.01)
    lora = RooflineCost(MODELS["hunyuan_video"], replace(WORKLOADS["hunyuan_video"], training=LORA_REPLICATED), tb, 12, 20)
    assert lora.publish_bytes() == 2 * 64 * ARCHS["hunyuan_video"].adapter_dims
    assert lora.time("publish", 1, "trainer") < 0.05 * c.time("publish", 1, "trainer")
    # replicated LoRA: ring all-reduce of fp32 LoRA grads, Adam over every LoRA parameter on each rank
    L = 64 * ARCHS["hunyuan_video"].adapter_dims
    assert lora.time("allreduce", 1, "trainer") == pytest.approx(2 * 4 * L * 19 / 20 / bus + 1e-3)
    assert lora.time("optimizer", 1, "trainer") == pytest.approx(28 * L / 3350e9 + 1e-3)


def test_a_sharded_pool_is_one_shard_group_whose_actions_split_over_its_ranks():
    """What the runtime runs (train.sharding=fsdp): TAG and chunks are collectives of the 12 ranks, each rank
    takes ceil(n / 12) of the action; every forward gathers the shards (no inference copy: switch 0); the
    gradients are reduce-scattered inside each chunk, so the commit has no gradient sync left."""
    from digenrl.sim.presets import LORA_REPLICATED

    c = RooflineCost(MODELS["flux"], WORKLOADS["flux"], TESTBEDS["C"], 4, 12)
    P = MODELS["flux"].archi.params
    # 12 ranks on slots 0-11: 8 on node 0, 4 on node 1; ring bus = the slowest node's NICs, 4 x 25 GB/s
    bus = min(450e9, 4 * 200e9 / 8)
    gather = 2 * P * 11 / 12 / bus
    assert c.gather_s == pytest.approx(gather)
    assert c.time("tag_switch", 1, "trainer") == 0.0
    assert c.time("denoise", 12, "trainer") == pytest.approx(c.time("denoise", 1, "trainer"))  # 1 per rank
    assert c.time("vae_decode", 13, "trainer") > c.time("vae_decode", 12, "trainer")           # 2 on some rank
    assert c.time("denoise", 1, "trainer") >= gather
    assert c.time("train_chunk", 24, "trainer") == pytest.approx(c.time("train_chunk", 13, "trainer"))  # 2 per rank
    assert c.time("train_chunk", 1, "trainer") >= 2 * gather + 4 * P * 11 / 12 / bus
    assert c.time("allreduce", 1, "trainer") == pytest.approx(1e-3)
    assert c.max_chunk == 12 * c.max_cells
    r = RooflineCost(MODELS["flux"], replace(WORKLOADS["flux"], training=LORA_REPLICATED), TESTBEDS["C"], 4, 12)
    assert r.time("tag_switch", 1, "trainer") == 0.0


def test_tag_with_an_inference_copy_pays_one_gather_per_switch_and_none_per_forward():
    """training.tag_copy (tuning.tag_inference_copy): the switch into generation all-gathers the bf16 weights
    once; the ranks' generation forwards then run at their share's compute (or HBM) time, with no gather floor."""
    from digenrl.sim.presets import Training
    from digenrl.sim.roofline import InfeasibleError

    w = replace(WORKLOADS["flux"], training=Training(tag_copy=True))
    c = RooflineCost(MODELS["flux"], w, TESTBEDS["B"], 10, 22)
    plain = RooflineCost(MODELS["flux"], WORKLOADS["flux"], TESTBEDS["B"], 10, 22)
    P, gpu = MODELS["flux"].archi.params, TESTBEDS["B"].gpu
    # 22 trainer ranks: 8 + 8 + 6 per node; the ring runs at the slowest node's 6 NICs (6 x 50 GB/s)
    assert c.time("tag_switch", 1, "trainer") == pytest.approx(2 * P * 21 / 22 / min(450e9, 6 * 400e9 / 8))
    assert plain.time("denoise", 1, "trainer") >= plain.gather_s                      # gathered per forward
    # without the copy a forward gathers the shards, overlapped but for the exposed share x = 0.1:
    # x gather + max(forward, (1 - x) gather) + overhead
    ov, g = c.effs["trainer"].overhead_s, plain.gather_s
    bare = c.time("denoise", 1, "trainer") - ov
    assert plain.time("denoise", 1, "trainer") == pytest.approx(0.1 * g + max(bare, 0.9 * g) + ov)
    assert c.time("denoise", 1, "trainer") < plain.time("denoise", 1, "trainer")
    assert c.time("denoise", 1, "trainer") >= 2 * P / (gpu.hbm_gbs * 1e9)          # still reads the weights
    assert c.time("denoise", 22, "trainer") == pytest.approx(c.time("denoise", 1, "trainer"))  # 1 per rank
    assert c.time("denoise", 1, "generator") == plain.time("denoise", 1, "generator")
    # where the copy does not fit beside the training state (HunyuanVideo on 12 L40S: training fits), refused
    with pytest.raises(InfeasibleError, match="inference copy"):
        RooflineCost(MODELS["hunyuan_video"], replace(WORKLOADS["hunyuan_video"], training=Training(tag_copy=True)),
                     TESTBEDS["A"], 20, 12)


def test_colocated_switch_from_bytes_and_bandwidths():
    P = MODELS["hunyuan_video"].archi.params
    tb = TESTBEDS["A"]
    # 32 ranks: optimizer shards are small, the inference copy fits: gather + bucketed hand-off only
    c = RooflineCost(MODELS["hunyuan_video"], WORKLOADS["hunyuan_video"], tb, 0, 32, colocated=True)
    assert not c.switch.offload
    # L40S servers have no NVLink: inside a node the ranks talk over PCIe Gen4 (32 GB/s one way), below their
    # 8 NICs' 8 x 25 GB/s, so the 32-rank ring runs at 32 GB/s
    assert c.time("tag_switch", 1, "trainer") == pytest.approx(2 * P * 31 / 32 / 32e9 + 2 * P / 864e9)
    # gradients are free while a colocated rank generates, so the 2P inference copy takes their place (the bytes
    # of the memory plan, train.memory; 48 GiB)
    items = c.memory.plan.items
    resident = sum(items.values()) - items["grads"]
    assert c.max_fragment == int((48 * 2**30 - resident - 2 * P) // c.act_infer)


def test_colocated_offload_when_the_copy_does_not_fit():
    from digenrl.sim.colocation import RankMemory, colocated_switch

    P, gb = 10e9, 1e9
    mem = RankMemory(params=2 * P / 4, optimizer=12 * P / 4, reserve=3 * gb)   # 5 + 30 + 3
    # resident while generating: 5 + 30 + 3 + copy 20 = 58 GB > 48 GB -> offload the 30 GB optimizer state
    sw = colocated_switch(mem, P, 4, True, 48 * gb, 2 * gb, 25 * gb, 864 * gb, 32 * gb)
    assert sw.offload and sw.offload_s == pytest.approx(2 * 30 / 32)
    assert sw.free_for_generation == pytest.approx((48 - 58 + 30) * gb)
    assert sw.seconds == pytest.approx(2 * P * 3 / 4 / (25 * gb) + 2 * P / (864 * gb) + 2 * 30 / 32)
    assert colocated_switch(mem, P, 4, True, 29 * gb, 2 * gb, 25 * gb, 864 * gb, 32 * gb) is None
    fits = colocated_switch(mem, P, 4, True, 80 * gb, 2 * gb, 25 * gb, 864 * gb, 32 * gb)
    assert not fits.offload and fits.offload_s == 0.0
    rep = colocated_switch(mem, P, 4, False, 80 * gb, 2 * gb, 25 * gb, 864 * gb, 32 * gb)
    assert rep.seconds == 0.0           # replicated: the training copy generates in-process


def test_batching_and_packing_pay_off_only_when_compute_is_not_saturated():
    c = RooflineCost(MODELS["flux"], WORKLOADS["flux"], TESTBEDS["A"], 8, 24)
    assert c.time("denoise", 8, "generator") / 8 < c.time("denoise", 1, "generator")
    assert c.time("train_chunk", 4, "trainer") / 4 < c.time("train_chunk", 1, "trainer")
    for op in ("denoise", "train_chunk", "vae_decode", "reward", "transfer"):
        assert c.time(op, 2, "trainer") >= c.time(op, 1, "trainer") > 0


def test_memory_limits():
    # 20B over 4 ranks: fp32 master + AdamW + fp32 grad shards = 16P/4 = 82 GB > 48 GiB (the memory plan)
    with pytest.raises(InfeasibleError, match="GiB per rank"):
        RooflineCost(MODELS["qwen_image"], WORKLOADS["qwen_image"], TESTBEDS["A"], 8, 4)
    ok = RooflineCost(MODELS["qwen_image"], WORKLOADS["qwen_image"], TESTBEDS["A"], 8, 24)  # 16P/24 = 14 GB
    assert ok.max_cells >= 1
    items = ok.memory.plan.items
    assert items["grads"] == pytest.approx(4 * MODELS["qwen_image"].archi.params / 24)  # reduce-scattered per chunk
    assert ok.memory.plan.state + ok.max_cells * ok.act_cell <= 48 * 2**30


def test_heterogeneous_pools_price_each_side_on_its_gpu():
    c = RooflineCost(MODELS["flux"], WORKLOADS["flux"], TESTBEDS["A+C"], 24, 16)
    # L40S (362 TF) generates faster than H20 (148 TF) when compute-bound (the 16 H20 ranks are one shard
    # group: 64 samples are 4 per rank)
    assert c.time("vae_decode", 4, "generator") < c.time("vae_decode", 64, "trainer")


def test_colocated_publish_is_free():
    s = Scenario(MODELS["flux"], TESTBEDS["B"], WORKLOADS["flux"], 8, steps=1)
    cost = RooflineCost(MODELS["flux"], WORKLOADS["flux"], TESTBEDS["B"], 0, 8, colocated=True)
    plan = make_plan(s, Mode.COLOCATED, Candidate(Split(0, 8, s.testbed.gpu, s.testbed.gpu), 1), cost)
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
    assert p.time("denoise", 0.5, "generator") == pytest.approx(0.75)  # extrapolated from the first two
    only_trainer = {k: v for k, v in ALL.items() if k != "tag_switch"}
    q = ProfileCost.from_dict(_profile({**only_trainer, "trainer/tag_switch": [[1, 0.2]],
                                        "generator/tag_switch": [[1, 0.3]]}))  # an op given per pool only
    assert (q.time("tag_switch", 1, "trainer"), q.time("tag_switch", 1, "generator")) == (0.2, 0.3)
    with pytest.raises(ProfileError, match="missing tag_switch"):  # ... it must be given for both pools
        ProfileCost.from_dict(_profile({**only_trainer, "trainer/tag_switch": [[1, 0.2]]}))


@pytest.mark.parametrize("data, msg", [
    ({"format": "x", "version": 1, "ops": ALL}, "format"),
    (_profile({**ALL, "warp": [[1, 1]]}), "unknown op"),
    (_profile({k: v for k, v in ALL.items() if k != "publish"}), "missing publish"),
    (_profile({**ALL, "denoise": [[1, 1], [1, 2]]}), "duplicate"),
    (_profile({**ALL, "denoise": [[0, 1]]}), "batch > 0"),
    (_profile({**ALL, "denoise": "fast"}), "non-empty list"),
    ([ALL], "top level must be an object"),
    ({"format": "digenrl-profile", "version": 2, "ops": ALL}, r"unsupported 'version' 2 \(expected 1\)"),
    (_profile({}), "'ops' must be a non-empty object"),
    (_profile({**ALL, "gpu/denoise": [[1, 1]]}), r"ops.gpu/denoise: unknown op .*pool prefixes"),
    (_profile({**ALL, "denoise": [[1, "1s"]]}), r"bad point \[1, '1s'\]"),
    (_profile({**ALL, "denoise": [[1, True]]}), r"bad point \[1, True\]"),
    (_profile({**ALL, "denoise": [[1, -0.5]]}), "needs batch > 0 and seconds >= 0"),
])
def test_profile_errors(data, msg):
    with pytest.raises(ProfileError, match=msg):
        ProfileCost.from_dict(data)


def test_profile_file_round_trip(tmp_path):
    roof = RooflineCost(MODELS["hunyuan_video"], WORKLOADS["hunyuan_video"], TESTBEDS["B"], 12, 20)
    path = save_profile(tabulate(roof, (1, 2, 4)), tmp_path / "p.json")
    loaded = load_profile(path)
    assert json.loads(path.read_text())["format"] == "digenrl-profile"
    for op in ("denoise", "train_chunk", "vae_decode"):
        assert loaded.time(op, 2, "trainer") == pytest.approx(roof.time(op, 2, "trainer"))
    assert loaded.time("allreduce", 1, "trainer") == pytest.approx(roof.time("allreduce", 1, "trainer"))
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ProfileError, match="not valid JSON"):
        load_profile(tmp_path / "broken.json")


def test_every_profile_writer_goes_through_save_profile(tmp_path):
    """One builder (``profile_dict``) and one writer (``save_profile``, which refuses a dict ``load_profile``
    would refuse, and writes nothing then); the calibration and the observed profile build their dicts with it."""
    import inspect

    from digenrl.control import observed
    from digenrl.control.profile import profile_dict
    from digenrl.runtime import calibrate, calibrate_cli

    data = profile_dict(ALL, "hand", (2, 3))
    assert data == {"format": "digenrl-profile", "version": 1, "source": "hand", "generators": 2, "trainers": 3,
                    "ops": ALL}
    path = save_profile(data, tmp_path / "p.json")
    assert json.loads(path.read_text()) == data and load_profile(path).time("reward", 4, "generator") == pytest.approx(0.4)
    with pytest.raises(ProfileError, match="missing publish"):
        save_profile(profile_dict({k: v for k, v in ALL.items() if k != "publish"}), tmp_path / "bad.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json"]  # no partial or temp file left
    for mod in (observed, calibrate, calibrate_cli):  # nobody writes the schema's header by hand
        assert "digenrl-profile\"" not in inspect.getsource(mod).replace("'", '"'), mod.__name__
    assert "save_profile(" in inspect.getsource(calibrate) and "save_profile(" in inspect.getsource(calibrate_cli)
    meas = {"train": {1: 0.5, 2: 0.9}, "allreduce": 0.1, "optimizer": 0.05, "publish": 0.2}
    gen = {1: {"sample": 0.4, "decode": 0.1, "reward": 0.05, "transfer": 0.01}}
    built = calibrate.build_profile(gen, gen, meas, 4, 0.001, "test", (1, 2))
    assert {k: built[k] for k in ("format", "version", "generators", "trainers")} == {
        "format": "digenrl-profile", "version": 1, "generators": 1, "trainers": 2}
    ProfileCost.from_dict(built)
