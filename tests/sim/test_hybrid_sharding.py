"""Hybrid sharding in the simulator and the planner: k shard groups of g = N / k ranks, each a scheduler trainer.

Oracles: the cost arithmetic written out here (a ring all-reduce of the fp32 gradient shards across the k
replicas; a group's memory and per-rank shares are those of a g-rank pool), the schedule audit, and an
pinned searches against the free one."""

from __future__ import annotations

import math
from dataclasses import replace

from digenrl.schedule import Durations, Mode
from digenrl.schedule.audit import audit
from digenrl.sim.executor import simulate
from digenrl.sim.planner import Candidate, Split
from digenrl.sim.scenario import PresetSource, Scenario
from digenrl.sim.scenario import make_plan as _make_plan


def make_plan(s, mode, n_gen, n_train, cost):
    """The plan of the scenario's own candidate on an n_gen + n_train split, fragments of 1."""
    gpu = s.testbed.gpu
    c = Candidate(Split(n_gen, n_train, gpu, gpu), 1, shard_groups=s.workload.training.shard_groups)
    return _make_plan(s, mode, c, cost)


def group_options(s, mode, split):
    return PresetSource(s, mode).values(split, "shard_groups")
from digenrl.sim.presets import MODELS, TESTBEDS, WORKLOADS, Training
from digenrl.sim.roofline import RooflineCost


def _cost(k: int, n_train: int = 24, model: str = "hunyuan_video", tb: str = "A") -> RooflineCost:
    w = replace(WORKLOADS[model], training=Training(shard_groups=k))
    return RooflineCost(MODELS[model], w, TESTBEDS[tb], 32 - n_train, n_train)


def test_commit_adds_the_ring_all_reduce_of_the_gradient_shards_across_groups():
    one, two, three = _cost(1), _cost(2), _cost(3)
    net, P = TESTBEDS["A"].net_bytes_s, float(one.trainable)
    assert math.isclose(one.time("allreduce", 1, "trainer"), 1e-3)  # one group: the backward reduce-scattered
    for k, c in ((2, two), (3, three)):
        g = 24 // k
        ring = 2.0 * (k - 1) / k * 4.0 * P / g / net  # fp32 shard of P / g parameters, ring over k replicas
        assert math.isclose(c.time("allreduce", 1, "trainer"), ring + 1e-3, rel_tol=1e-12)


def test_a_group_is_priced_as_a_pool_of_its_own_ranks():
    two, alone = _cost(2), _cost(1, n_train=12)
    assert two.group_ranks == 12 and two.max_chunk == alone.max_chunk  # 12 x the per-rank cells
    assert two.memory.plan.state == alone.memory.plan.state  # sharded over the group's 12 ranks
    for c in (1, 12, 13, 30):
        assert two.time("train_chunk", c, "trainer") == alone.time("train_chunk", c, "trainer")
        assert math.ceil(c / 12) == two._share(c, "trainer")


def test_plan_has_one_scheduler_trainer_per_group_and_the_schedule_audits_clean():
    w = replace(WORKLOADS["hunyuan_video"], training=Training(shard_groups=3))
    s = Scenario(MODELS["hunyuan_video"], TESTBEDS["A"], w, 32, steps=3)
    cost = RooflineCost(s.model, w, s.testbed, 8, 24)
    plan = make_plan(s, Mode("gap_tsp_tag"), 8, 24, cost)
    assert plan.trainers == ("shard0", "shard1", "shard2") and plan.shard_ranks == 8
    res = simulate(plan, cost)
    assert audit(plan, res.actions, res.events) == []
    trained = {a.rank for _, a in res.actions if type(a).__name__ == "Train"}
    assert trained == set(plan.trainers)  # TSP spreads the chunks over the groups
    assert Durations(plan, cost).commit() > Durations(make_plan(s, Mode("gap_tsp_tag"), 8, 24,
                                                                _cost(1)), _cost(1)).commit()


def test_group_options_divide_the_ranks_into_groups_of_two_or_more():
    s = Scenario(MODELS["hunyuan_video"], TESTBEDS["A"], WORKLOADS["hunyuan_video"], 32, steps=3)
    split = Split(8, 24, TESTBEDS["A"].gpu, TESTBEDS["A"].gpu)
    assert group_options(s, Mode("full"), split) == [1, 2, 3, 4, 6]
    assert group_options(s, Mode("full"), Split(27, 5, split.gen_gpu, split.train_gpu)) == [1]
    assert group_options(s, Mode("gap"), split) == [1]  # no TSP: one trainer's chunks anyway (not searched)
    assert group_options(s, Mode("colocated"), split) == [1]
    lora = replace(s, workload=replace(s.workload, training=Training(lora_rank=64, sharded=False)))
    assert group_options(lora, Mode("full"), split) == [1]  # replicated ranks: nothing to group


def test_pinned_shard_groups_are_the_planner_best_at_that_k():
    """``run_mode(shard_groups=k)`` searches the rest (split, fragment, copy, publish) for that k only; the
    unpinned search over every k is never slower than the pinned ones (20 GPUs; as many steps as a ``full`` probe:
    the probe is the run)."""
    from digenrl.sim.planner import FULL_PROBE_STEPS
    from digenrl.sim.scenario import run_mode

    w = WORKLOADS["hunyuan_video"]
    s = Scenario(MODELS["hunyuan_video"], TESTBEDS["A"], w, 20, steps=FULL_PROBE_STEPS)
    pinned = {k: run_mode(s, "full", shard_groups=k) for k in (1, 2)}
    assert {k: r.shard_groups for k, r in pinned.items()} == {1: 1, 2: 2}
    assert pinned[2].plan.trainers == ("shard0", "shard1") and len(pinned[1].plan.trainers) == 1
    free = run_mode(s, "full")  # every split, every k that divides its trainer ranks
    assert free.result.step_time <= min(r.result.step_time for r in pinned.values()) + 1e-9
