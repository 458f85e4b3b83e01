"""The peer baselines (their configs, labels and loops against hand formulas), `digenrl simulate --json`'s baseline
columns, the equal-cost arithmetic, the load-balanced colocation and the anchors script's records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from digenrl.schedule.cost import TRAINER
from digenrl.sim.balanced import GPU_HOUR_USD, balanced_step, break_even_price, kind_rates, load_balanced_colocated
from digenrl.sim.baselines import (DanceGRPOLoop, FlowGRPOLoop, baselines, dancegrpo, flow_grpo,
                                   idealised)
from digenrl.sim.comm import overlapped
from digenrl.sim.presets import H20, L40S, MODELS, TESTBEDS, WORKLOADS, Training
from digenrl.sim.roofline import RooflineCost

ROOT = Path(__file__).resolve().parents[2]


def test_flow_grpo_batches_and_lora_as_its_configs_set_them():
    """config/grpo.py: sample.train_batch_size (= train.batch_size) FLUX 3, Qwen-Image 4, SD3.5 9, Wan 8; LoRA
    ranks of the training scripts; DDP (replicated), never FSDP."""
    want = {"flux": (3, 64, "pickscore_flux"), "qwen-image": (4, 64, "pickscore_qwenimage"),
            "sd35-medium": (9, 32, "pickscore_sd3"), "wan": (8, 32, "general_ocr_wan2_1")}
    for model, (batch, rank, cfg) in want.items():
        b = flow_grpo(model)
        assert (b.config.train_batch, b.config.sample_batch, b.config.lora_rank) == (batch, batch, rank)
        assert b.training == Training(lora_rank=rank, sharded=False)
        assert cfg in b.source and f"{batch} samples per forward/backward" in b.label and "DDP" in b.label
    assert flow_grpo("hunyuan") is None  # flow_grpo has no HunyuanVideo config: no baseline named after it


def test_dancegrpo_is_full_fine_tuning_fsdp_batch_one_and_named_only_where_it_has_a_config():
    for model in ("flux", "hunyuan"):
        b = dancegrpo(model)
        assert b.label.startswith("DanceGRPO (") and b.training.sharded and b.training.lora_rank == 0
        assert (b.config.train_batch, b.config.sample_batch) == (1, 1) and "fp32" in b.label
    for model in ("wan", "qwen-image"):
        assert not dancegrpo(model).label.startswith("DanceGRPO") and "no DanceGRPO config" in dancegrpo(model).label
    assert "no peer runs this loop" in idealised(Training()).label
    for model in ("flux", "wan", "hunyuan", "qwen-image"):  # no label names flow_grpo or DanceGRPO's loop wrongly
        for b in baselines(model, Training()):
            assert ("flow_grpo" in b.label) == (b.name == "flow_grpo")


def test_flow_grpo_loop_prices_its_batches():
    b = flow_grpo("flux")
    base = RooflineCost(MODELS["flux"], __import__("dataclasses").replace(WORKLOADS["flux"], training=b.training),
                        TESTBEDS["B"], 0, 8, colocated=True)
    loop = b.variant(base)
    assert isinstance(loop, FlowGRPOLoop)
    for c in (1, 3, 7, 16):
        assert loop.time("train_chunk", c, TRAINER) == pytest.approx(c / 3 * base.time("train_chunk", 3, TRAINER))
        # sampling on the peft module, adapters unmerged: x 1.28 (verl-omni issue 248)
        assert loop.time("denoise", c, TRAINER) == pytest.approx(c / 3 * base.time("denoise", 3, TRAINER) * 1.28)
        assert loop.time("vae_decode", c, TRAINER) == pytest.approx(c / 3 * base.time("vae_decode", 3, TRAINER))
    assert loop.time("allreduce", 1, TRAINER) == base.time("allreduce", 1, TRAINER)
    assert loop.time("tag_switch", 1, TRAINER) == 0.0  # replicated LoRA: the training copy generates


def test_dancegrpo_loop_gathers_per_forward_and_reduce_scatters_fp32_per_cell():
    """32 ranks on 4 HGX nodes of H100: ring bus = 8 NICs x 50 GB/s = 400 GB/s (under NVLink's 450)."""
    base = RooflineCost(MODELS["flux"], WORKLOADS["flux"], TESTBEDS["B"], 0, 32, colocated=True)
    loop = dancegrpo("flux").variant(base)
    assert isinstance(loop, DanceGRPOLoop)
    P, bus, x = MODELS["flux"].archi.params, 400e9, 0.1
    gather, scatter = 2 * P * 31 / 32 / bus, 4 * P * 31 / 32 / bus
    ov = base.effs[TRAINER].overhead_s
    comp = base.train_flops_per_cell() / (989e12 * base.effs[TRAINER](base.seq))
    one = overlapped(comp, 2 * gather + scatter, x) + 3 * ov
    assert loop.time("train_chunk", 5, TRAINER) == pytest.approx(5 * one)
    fwd = base.time("denoise", 1, TRAINER) - ov
    assert loop.time("denoise", 4, TRAINER) == pytest.approx(4 * (x * gather + max(fwd, (1 - x) * gather) + ov))
    assert loop.time("tag_switch", 1, TRAINER) == 0.0 and loop.time("allreduce", 1, TRAINER) == pytest.approx(1e-3)


def test_simulate_json_rows_carry_each_baseline(capsys):
    from digenrl.sim.cli import main

    assert main(["--model", "flux", "--testbed", "B", "--gpus", "8", "--modes", "colocated", "naive",
                 "--steps", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    for r in rows:
        assert set(r["baselines"]) == {"idealised", "flow_grpo", "dancegrpo"}
        for b in r["baselines"].values():
            assert b["speedup"] == pytest.approx(b["step_time_s"] / r["step_time_s"])
            assert b["label"] and b["source"] and b["training"]
        assert r["baselines"]["flow_grpo"]["same_training"] is False  # full fine-tuning here, LoRA there
        assert r["baselines"]["idealised"]["same_training"] is True
    coloc = next(r for r in rows if r["mode"] == "colocated")
    assert coloc["baselines"]["idealised"]["step_time_s"] == pytest.approx(coloc["step_time_s"])
    assert main(["--model", "flux", "--testbed", "B", "--exposed-comm", "2"]) == 2
    assert "--exposed-comm" in capsys.readouterr().err


def test_equal_cost_arithmetic():
    # 48 GPUs (32 L40S + 16 H20, both $3.766) at 80 s against 32 L40S at 100 s
    assert GPU_HOUR_USD[L40S.name][0] == GPU_HOUR_USD[H20.name][0] == pytest.approx(30.131 / 8)
    # break-even H20 price: 100 x 32 pL = 80 (32 pL + 16 p)  ->  p = (3200 - 2560) pL / 1280 = 0.5 pL
    p = break_even_price(100.0, [(L40S, 32)], 80.0, [(L40S, 32), (H20, 16)], H20)
    assert p == pytest.approx(0.5 * 30.131 / 8)


def test_load_balanced_colocation_shares_work_by_speed():
    m, w, tb = MODELS["flux"], WORKLOADS["flux"], TESTBEDS["A+C"]
    ra, rc = (kind_rates(m, w, tb, g, n, 48) for g, n in ((L40S, 32), (H20, 16)))
    b, s = w.prompts * w.generations, w.trained_timesteps
    hand = (b / (ra.gen_per_s + rc.gen_per_s) + b * s / (ra.cells_per_s + rc.cells_per_s)
            + max(ra.switch_s, rc.switch_s) + max(ra.commit_s, rc.commit_s))
    got = load_balanced_colocated(m, w, tb)
    assert balanced_step([ra, rc], w) == pytest.approx(hand) and got["step_s"] == pytest.approx(hand)
    assert got["gen_share"][L40S.name] == pytest.approx(ra.gen_per_s / (ra.gen_per_s + rc.gen_per_s))
    # each kind's rate is its ranks' throughput at one rank's pace
    c = RooflineCost(m, w, tb, 0, 48, colocated=True, train_gpu=H20)
    k = -(-b // 48)
    assert rc.cells_per_s == pytest.approx(16 * k / c.time("train_chunk", k, TRAINER))


def test_anchors_script_records():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import anchors

    res = anchors.run_all()
    names = [a["anchor"] for a in res["anchors"]]
    assert len(names) == 6 and any("torch.compile" in n for n in names)
    assert sum("VeRL-Omni" in n for n in names) == 2 and sum("MixGRPO" in n for n in names) == 2
    for a in res["anchors"]:
        assert a["error"] == pytest.approx(a["predicted"] / a["published"] - 1)
        assert a["within_tolerance"] == (abs(a["error"]) <= res["tolerance"])
        assert a["unknown"] and a["config"] and a["source"]
        if not a["within_tolerance"] and a.get("train_efficiency_to_match"):
            assert (a["train_efficiency_to_match"] < 1) == (a["predicted"] > a["published"]
                                                           if a["unit"] == "img/GPU/s"
                                                           else a["predicted"] < a["published"])
    assert {a["published"] for a in res["anchors"]} == {6.71, 4.30, 0.510, 291.3}
    assert len(res["refit"]) == 2
