"""The cost model's placement-aware collectives, exposed communication and attention backward, against formulas
written here from the hardware numbers (datasheet figures typed in, not read from the presets)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from digenrl.sim.assumptions import Assumptions
from digenrl.sim.comm import Fabric, overlapped, pool_slots
from digenrl.sim.presets import H20, H100, L40S, MODELS, TESTBEDS, WORKLOADS, Training
from digenrl.sim.roofline import RooflineCost

NVLINK_H100 = 900e9 / 2     # H100 SXM NVLink 900 GB/s both directions: 450 GB/s one way
NIC_B = 400e9 / 8           # testbed B: 400 Gb/s per GPU
B = 24e9                    # bytes gathered


def test_all_gather_inside_one_node_runs_at_nvlink_rate():
    f = Fabric(TESTBEDS["B"])
    assert f.ring_s(B, list(range(8))) == pytest.approx(B * 7 / 8 / NVLINK_H100)
    assert f.ring_s(B, [0, 1]) == pytest.approx(B * 1 / 2 / NVLINK_H100)
    assert f.ring_s(B, [3]) == 0.0


def test_across_nodes_each_node_pushes_through_its_own_nics():
    f = Fabric(TESTBEDS["B"])
    # one rank on each of two nodes: one NIC's rate
    assert f.ring_s(B, [0, 8]) == pytest.approx(B * 1 / 2 / NIC_B)
    # 8 + 8 ranks: 8 NICs per node (400 GB/s), under NVLink's 450 GB/s
    assert f.ring_s(B, list(range(16))) == pytest.approx(B * 15 / 16 / (8 * NIC_B))
    # 8 + 2 ranks: the node with 2 ranks has 2 NICs and sets the pace
    assert f.ring_s(B, list(range(10))) == pytest.approx(B * 9 / 10 / (2 * NIC_B))
    assert f.allreduce_s(B, list(range(10))) == pytest.approx(2 * B * 9 / 10 / (2 * NIC_B))
    # a PCIe server (L40S, no NVLink): 32 GB/s inside the node caps the 8 x 25 GB/s of NICs
    a = Fabric(TESTBEDS["A"])
    assert a.ring_s(B, list(range(16))) == pytest.approx(B * 15 / 16 / 32e9)
    assert a.ring_s(B, list(range(8))) == pytest.approx(B * 7 / 8 / 32e9)


def test_pools_are_packed_trainers_first_and_kinds_on_their_own_nodes():
    b = Fabric(TESTBEDS["B"])
    gens, trainers = pool_slots(b, H100, 8, H100, 24, False)
    assert trainers == list(range(24)) and gens == list(range(24, 32))
    ac = Fabric(TESTBEDS["A+C"])
    gens, trainers = pool_slots(ac, H20, 16, L40S, 32, False)
    assert trainers == list(range(32)) and gens == list(range(32, 48))  # the H20s start on node 4
    assert ac.gpu_of_node(4).name == H20.name and ac.gpu_of_node(3).name == L40S.name
    _, coloc = pool_slots(ac, H20, 0, H20, 48, True)  # more ranks than H20s: its own first, then the L40S nodes
    assert coloc[:16] == list(range(32, 48)) and sorted(coloc) == list(range(48))
    assert b.p2p_bytes_s([0], [1]) == pytest.approx(NVLINK_H100) and b.p2p_bytes_s([0], [8]) == pytest.approx(NIC_B)


def test_exposed_share_of_overlapped_communication():
    assert overlapped(2.0, 1.0, 0.0) == 2.0 and overlapped(1.0, 2.0, 0.0) == 2.0      # max(compute, comm)
    assert overlapped(2.0, 1.0, 1.0) == 3.0                                           # compute + comm
    assert overlapped(2.0, 1.0, 0.25) == pytest.approx(0.25 * 1.0 + 2.0)
    assert overlapped(1.0, 4.0, 0.25) == pytest.approx(0.25 * 4.0 + max(1.0, 0.75 * 4.0))
    with pytest.raises(ValueError, match="exposed_comm"):
        overlapped(1.0, 1.0, 1.5)


@pytest.mark.parametrize("x", [0.0, 0.25, 0.5])
def test_a_chunk_pays_the_exposed_share_of_its_gathers_and_scatter(x):
    """FLUX full fine-tuning on 12 H20 trainer ranks (8 + 4 per node: the ring at 4 NICs' 100 GB/s): a chunk
    of 12 cells (one per rank) = x comm + max(compute, (1 - x) comm) + 3 launch overheads."""
    c = RooflineCost(MODELS["flux"], WORKLOADS["flux"], TESTBEDS["C"], 4, 12, assume=Assumptions(exposed_comm=x))
    P, bus = MODELS["flux"].archi.params, 4 * 200e9 / 8
    comm = 2 * (2 * P * 11 / 12 / bus) + 4 * P * 11 / 12 / bus
    eff = c.effs["trainer"]
    compute = c.train_flops_per_cell() / (148e12 * eff(c.seq))
    expect = x * comm + max(compute, (1 - x) * comm) + 3 * eff.overhead_s
    assert c.time("train_chunk", 12, "trainer") == pytest.approx(expect)


def test_attention_backward_factor():
    """A cell's FLOPs: forward (L + A) + input grads (L + k A) + weight grads L (full) + recomputed forward."""
    w = WORKLOADS["wan"]
    for k in (1.0, 2.5):
        c = RooflineCost(MODELS["wan"], w, TESTBEDS["B"], 8, 24, assume=Assumptions(attn_backward=k))
        F, L = c.fwd_flops, c.fwd_linear
        assert c.train_flops_per_cell() == pytest.approx(2 * ((L + (F - L)) + (L + k * (F - L)) + L + F))  # CFG: 2
    lo = RooflineCost(MODELS["wan"], w, TESTBEDS["B"], 8, 24, assume=Assumptions(attn_backward=1.0))
    hi = RooflineCost(MODELS["wan"], w, TESTBEDS["B"], 8, 24)
    share = (hi.train_flops_per_cell() - lo.train_flops_per_cell()) / lo.train_flops_per_cell()
    assert 0.09 < share < 0.2  # video: attention is a large share of a cell's FLOPs


def test_train_efficiency_scales_only_training_compute():
    w = replace(WORKLOADS["flux"], training=Training(lora_rank=64, sharded=False))
    one = RooflineCost(MODELS["flux"], w, TESTBEDS["B"], 8, 24)
    half = RooflineCost(MODELS["flux"], w, TESTBEDS["B"], 8, 24, assume=Assumptions(train_efficiency=0.5))
    ov = one.effs["trainer"].overhead_s
    assert half.time("train_chunk", 4, "trainer") - 3 * ov == pytest.approx(2 * (one.time("train_chunk", 4, "trainer")
                                                                                 - 3 * ov))
    assert half.time("denoise", 4, "generator") == one.time("denoise", 4, "generator")
    with pytest.raises(ValueError, match="train_efficiency"):
        Assumptions(train_efficiency=0.0)
