"""The simulator prices Ulysses sequence parallelism (issue 39 part B): the all-to-all against the formula written
here from the testbed's link rates and the published model configs, the ops that carry it, and the planner's
choice of a degree where the memory plan refuses the unsplit sequence.

Per self-attention layer 4 all-to-alls (q, k, v in, the output back), each moving (d - 1) / d of a rank's
activation bytes B = n_img / d x d_attn x 2 (bf16): at NVLink rate inside a node; across nodes each rank's
share for the other node goes through its NIC while the in-node share goes over NVLink."""

from __future__ import annotations

from dataclasses import replace

import pytest

from digenrl.sim.comm import Fabric
from digenrl.sim.presets import TESTBEDS, Training, model_preset, workload_preset
from digenrl.sim.roofline import RooflineCost

NVLINK_H100 = 900e9 / 2   # H100 SXM: 900 GB/s NVLink both directions, one direction
NIC_B = 400e9 / 8         # testbed B: 400 Gb/s per GPU
# Wan2.1-T2V-14B (diffusers transformer/config.json): 40 blocks, 40 heads x 128; 720p x 81 frames: VAE 4x temporal
# (21 latent frames), 8x spatial, patch 2 -> 21 x 45 x 80 tokens
WAN_LAYERS, WAN_DIM, WAN_TOKENS = 40, 40 * 128, 21 * 45 * 80


def test_all_to_all_inside_a_node_and_across_two():
    fab = Fabric(TESTBEDS["B"])
    b = 3.0e8
    assert fab.all_to_all_s(b, [0, 1, 2, 3]) == pytest.approx(b * 3 / 4 / NVLINK_H100, rel=1e-12)
    # slots 6, 7 on node 0 and 8, 9 on node 1: each rank sends 1/4 of B to its node-mate over NVLink and 2/4 of
    # B to the other node through its NIC, at once
    assert fab.all_to_all_s(b, [6, 7, 8, 9]) == pytest.approx(max(b / 4 / NVLINK_H100, b * 2 / 4 / NIC_B), rel=1e-12)
    assert fab.all_to_all_s(b, [5]) == 0.0


def _wan(sp: int) -> RooflineCost:
    w = workload_preset("wan_native")
    w = replace(w, training=Training(sequence_parallel=sp, generator_sequence_parallel=sp))
    return RooflineCost(model_preset("wan_native"), w, TESTBEDS["B"], 8, 24)


def test_the_all_to_alls_of_one_forward_match_the_formula():
    c = _wan(4)
    b = WAN_TOKENS / 4 * WAN_DIM * 2
    want = 4 * WAN_LAYERS * b * 3 / 4 / NVLINK_H100  # the lane's 4 ranks sit on one node
    assert c.a2a_s("trainer") == pytest.approx(want, rel=1e-12)
    assert c.a2a_s("generator") == pytest.approx(want, rel=1e-12)
    assert _wan(8).a2a_s("trainer") == pytest.approx(4 * WAN_LAYERS * (WAN_TOKENS / 8 * WAN_DIM * 2) * 7 / 8
                                                     / NVLINK_H100, rel=1e-12)


def test_denoise_and_training_carry_the_all_to_alls(monkeypatch):
    c = _wan(4)
    a2a = c.a2a_s("trainer")
    with_comm = {"denoise": c.time("denoise", 3, "generator"), "train": c.time("train_chunk", c.lanes, "trainer")}
    monkeypatch.setattr(Fabric, "all_to_all_s", lambda self, nbytes, slots: 0.0)
    # Wan samples with CFG (2 forwards per step); a training cell: forward, backward, recomputed forward, x 2 (CFG)
    assert with_comm["denoise"] - c.time("denoise", 3, "generator") == pytest.approx(3 * 2 * a2a, rel=1e-9)
    assert with_comm["train"] - c.time("train_chunk", c.lanes, "trainer") == pytest.approx(3 * 2 * a2a, rel=1e-9)


def test_the_planner_picks_sequence_parallelism_where_the_memory_plan_refuses_one_rank():
    from digenrl.sim.scenario import Scenario, run_mode
    from digenrl.train.memory import GiB, PlanInputs, plan_memory

    def cells(ranks: int, sp: int) -> int:  # the memory plan of a full fine-tuning FSDP rank, bf16, recomputation
        p = PlanInputs("hunyuan_video", 720, 1280, 129, model_dtype="bfloat16", mixed_precision="bf16",
                       activation_checkpointing=True, sharding="fsdp", ranks=ranks, sequence_parallel=sp)
        return plan_memory(p).max_cells(80 * GiB)

    assert all(cells(n, 1) == 0 for n in range(1, 16))  # no split of 16 GPUs trains one unsplit cell
    s = Scenario(model_preset("hunyuan_video_native"), TESTBEDS["B"], workload_preset("hunyuan_video_native"), 16,
                 steps=3)
    r = run_mode(s, "gap_tsp_tag")
    c = r.candidate
    assert c.sequence_parallel > 1 and r.plan.sequence_parallel == c.sequence_parallel
    assert cells(c.split.n_train // c.shard_groups, c.sequence_parallel) >= 1
