"""Online cost refinement (schedule.online_cost): the factors against hand-computed sums, and the scheduler
planning with them on a machine its profile misjudges (the true durations are the oracle)."""

from __future__ import annotations

import pytest

from digenrl.control.loop import run_loop
from digenrl.control.timeline import Timeline
from digenrl.schedule import BTSConfig, Commit, Generate, OnlineCosts, Publish, ScaledCost, Scheduler, Train
from digenrl.schedule.layout import Chunk, Fragment
from digenrl.sim.executor import VirtualExecutor, simulate

from sched_helpers import LinCost, make_plan

COST = LinCost({"denoise": (0.01, 0.02), "vae_decode": (0.0, 0.005), "reward": (0.002, 0.0), "transfer": (0.001, 0.0),
                "train_chunk": (0.05, 0.03), "allreduce": (0.01, 0.0), "optimizer": (0.02, 0.0),
                "publish": (0.04, 0.0), "tag_switch": (0.0, 0.0)})


def test_scaled_cost_scales_each_op_by_its_action_kind():
    f = {"generate/generator": 2.0, "generate/trainer": 3.0, "train": 0.5, "commit": 4.0, "publish": 5.0}
    c = ScaledCost(COST, f)
    assert c.time("denoise", 4, "generator") == pytest.approx(2.0 * (0.01 + 0.08))
    assert c.time("reward", 4, "trainer") == pytest.approx(3.0 * 0.002)
    assert c.time("tag_switch", 1, "trainer") == 0.0
    assert c.time("train_chunk", 2, "trainer") == pytest.approx(0.5 * 0.11)
    assert c.time("allreduce", 1, "trainer") == pytest.approx(0.04) and c.time("optimizer", 1, "trainer") == pytest.approx(0.08)
    assert c.time("publish", 1, "trainer") == pytest.approx(0.2)
    assert ScaledCost(COST, {}).time("train_chunk", 2, "trainer") == COST.time("train_chunk", 2, "trainer")
    with pytest.raises(ValueError, match="unknown action kind"):
        ScaledCost(COST, {"denoise": 2.0})
    with pytest.raises(ValueError, match="positive and finite"):
        ScaledCost(COST, {"train": 0.0})


def test_factors_are_decayed_ratios_of_sums_by_hand():
    plan = make_plan("gap_tsp_tag", T=3)
    on = OnlineCosts(plan, COST, decay=0.5, clip=4.0)
    gen = Generate(Fragment(0, 0, (0, 1)), "g0", 0)
    tag = Generate(Fragment(0, 1, (0, 1)), "t0", 0, tag=True)
    chunk = Train(Chunk(0, 0, ((0, 0), (1, 0))), "t0")
    p_gen = 3 * (0.01 + 0.04) + 0.01 + 0.002 + 0.001      # T * denoise(2) + vae(2) + reward + transfer = 0.163
    p_train = 0.05 + 0.06
    on.observe(gen, 0.2)
    on.observe(gen, 0.3)
    on.observe(chunk, 0.11)
    on.observe(Commit(0, ("t0", "t1")), 10.0)             # > 4 x 0.03: counts as 4 x 0.03
    on.observe(Publish(1, ("t0", "t1"), ("g0", "g1")), 0.0)  # < 0.04 / 4: counts as 0.01
    assert on.end_step() is not None
    assert on.scales["generate/generator"] == pytest.approx(0.5 / (2 * p_gen))
    assert on.scales["train"] == 1.0                       # within 1e-9 of 1: exactly 1
    assert on.scales["commit"] == pytest.approx(4.0) and on.scales["publish"] == pytest.approx(0.25)
    assert "generate/trainer" not in on.scales             # not seen: the profile's level
    # step 2: the old sums weigh half
    on.observe(gen, 0.1)
    on.observe(tag, 0.5)
    model = on.end_step()
    assert on.scales["generate/generator"] == pytest.approx((0.5 * 0.5 + 0.1) / (0.5 * 2 * p_gen + p_gen))
    assert on.scales["generate/trainer"] == pytest.approx(0.5 / p_gen)
    assert model.time("denoise", 2, "trainer") == pytest.approx(on.scales["generate/trainer"] * 0.05)
    assert on.end_step() is None                           # no new observation: the same factors
    with pytest.raises(ValueError, match="decay"):
        OnlineCosts(plan, COST, decay=1.0)


def _slower_machine():
    return ScaledCost(COST, {"generate/generator": 1.5, "generate/trainer": 1.5, "train": 0.7, "commit": 1.2,
                             "publish": 0.9})


def _span_errors(plan, machine, profile, online):
    """BTS's signed error per step, (realized - predicted commit) / predicted span, of a run on ``machine``
    planned with ``profile``."""
    sched = Scheduler(plan, cost=profile, bts_config=BTSConfig(policy="bts", online=online))
    run_loop(sched, VirtualExecutor(plan, machine), Timeline(plan))
    return sched, sched.bts.stats.span_errors()


@pytest.mark.parametrize("mode", ["gap_tsp_tag", "full"])
def test_online_factors_find_the_machine_and_bts_predicts_it(mode):
    """The run's machine is the profile times known factors: from step 1 on the scheduler holds those factors,
    and BTS predicts as if it had been given the machine's costs (the oracle: BTS planning with them)."""
    plan = make_plan(mode, prompts=4, generations=4, fragment_size=1, n_gen=2, n_train=2, steps=5, T=4)
    sched, online = _span_errors(plan, _slower_machine(), COST, True)
    st = sched.stats
    assert st[0].cost_scales == {}                         # step 0: the profile as it is
    for k in range(1, plan.steps):
        got = st[k].cost_scales
        assert got["generate/generator"] == pytest.approx(1.5) and got["train"] == pytest.approx(0.7)
        assert got["commit"] == pytest.approx(1.2)
        if k > 1:                                          # step 0's publish ends in step 1's window
            assert got["publish"] == pytest.approx(0.9)
    _, static = _span_errors(plan, _slower_machine(), COST, False)
    _, knowing = _span_errors(plan, _slower_machine(), _slower_machine(), False)
    assert online[0] == pytest.approx(static[0])           # step 0 cannot know better
    assert min(static) > 0.05                              # the static profile: every commit later than predicted
    if mode == "gap_tsp_tag":                              # from step 1 on: the predictions of the machine's costs
        assert online[1:] == pytest.approx(knowing[1:], abs=1e-9)
    else:                                                  # (TCSS: another history, so only closer)
        assert max(abs(e) for e in online[2:]) < 0.5 * min(static[2:])


def test_exact_costs_online_changes_nothing():
    """With the profile equal to the machine the factors are exactly 1: every action at the same time."""
    plan = make_plan("full", prompts=4, generations=4, fragment_size=1, n_gen=2, n_train=2, steps=4, T=4)
    on = simulate(plan, COST, bts=BTSConfig(policy="bts", online=True))  # (full's default, auto, is greedy)
    off = simulate(plan, COST, bts=BTSConfig(policy="bts", online=False))
    assert on.actions == off.actions and [s.committed for s in on.stats] == [s.committed for s in off.stats]
    assert all(set(s.cost_scales.values()) <= {1.0} for s in on.stats)
