"""Step times of tiny plans computed by hand (independent reasoning), and API behaviour."""

from __future__ import annotations

import pytest

from digenrl.schedule import (ChunkTrained, Committed, FragmentGenerated, Generate, PlanError, Publish,
                              Published, Scheduler, SchedulerError, StepPlan, Train)
from digenrl.sim.executor import simulate
from sched_helpers import LinCost, make_plan

# Generate(n) = T * denoise(n) = 2 * 1.0 * n ; Train(c) = 0.5 * c ; Commit = 0.3 ; Publish = 0.2
HAND = LinCost({"denoise": (0.0, 1.0), "train_chunk": (0.0, 0.5), "allreduce": (0.2, 0), "optimizer": (0.1, 0),
                "publish": (0.2, 0), "tag_switch": (0.1, 0)})


def tiny(mode, **kw):
    base = dict(prompts=2, generations=2, fragment_size=1, S=1, T=2, cg=1, cs=1, n_gen=2, n_train=2, steps=2)
    base.update(kw)
    return make_plan(mode, **base)


def test_naive_step_is_the_sum_of_its_phases():
    # 4 fragments of 2 s on 2 generators: 4 s. Training: contiguous shards, rank r holds group r's two
    # generations -> one chunk of 2 cells (1 s). Commit 0.3 s, publish 0.2 s. Step = 5.5 s.
    res = simulate(tiny("naive"), HAND)
    assert res.makespan == pytest.approx(2 * 5.5)
    assert [s.committed for s in res.stats] == pytest.approx([5.3, 10.8])


def test_gap_overlaps_training_with_generation():
    # group 0 is done at 2 s and trained (1 cell per rank, 0.5 s) while group 1 is generated (2-4 s);
    # group 1 trains 4-4.5 s; commit to 4.8; publish to 5.0.
    res = simulate(tiny("gap"), HAND)
    assert res.makespan == pytest.approx(2 * 5.0)


def test_colocated_generates_then_trains_on_the_same_workers():
    # each worker: switch 0.1 + 2 s + 2 s, then its 2-cell chunk 1 s, commit 0.3, publish free: 5.4 s.
    res = simulate(tiny("colocated"), HAND)
    assert res.makespan == pytest.approx(2 * 5.4)
    assert res.gen_idle == pytest.approx(0.0, abs=1e-12)


def test_tsp_spreads_a_small_group_over_all_ranks():
    # one group of 1 generation x 4 trained timesteps, 4 ranks: classic layout uses only the rank holding the
    # generation (4 x 0.5 s); TSP chunks of 1 cell run on all 4 ranks at once (0.5 s).
    kw = dict(prompts=1, generations=1, S=4, T=4, n_gen=1, n_train=4, steps=1)
    gen = 4.0
    assert simulate(tiny("gap", **kw), HAND).makespan == pytest.approx(gen + 2.0 + 0.3 + 0.2)
    assert simulate(tiny("gap_tsp", **kw), HAND).makespan == pytest.approx(gen + 0.5 + 0.3 + 0.2)


def test_tcss_generates_the_next_step_with_the_previous_version():
    res = simulate(tiny("full", steps=3, stale=0.5), HAND)
    stale = [a for _, a in res.actions if isinstance(a, Generate) and a.stale]
    assert stale and all(a.version == a.fragment.step - 1 for a in stale)
    assert all(s.stale_generations <= 2 for s in res.stats)  # floor(0.5 * B=4)
    assert res.makespan < simulate(tiny("gap_tsp", steps=3), HAND).makespan


def test_scheduler_api_round_trip_by_hand():
    plan = tiny("naive", steps=1, n_gen=1, n_train=1, prompts=1, generations=1)
    s = Scheduler(plan)
    (gen,) = s.start(0.0)
    assert isinstance(gen, Generate) and gen.worker == "g0" and gen.version == 0 and not gen.tag
    (train,) = s.on_event(FragmentGenerated(2.0, gen.fragment, "g0"))
    assert isinstance(train, Train) and train.chunk.cells == ((0, 0),)
    (commit,) = s.on_event(ChunkTrained(2.5, train.chunk, "t0"))
    assert commit.step == 0 and commit.ranks == ("t0",)
    (pub,) = s.on_event(Committed(2.8, 0))
    assert isinstance(pub, Publish) and pub.version == 1 and pub.generators == ("g0",)
    assert s.on_event(Published(3.0, 1)) == [] and s.done
    assert s.stats[0].committed == 2.8 and s.stats[0].published == 3.0


def test_scheduler_rejects_inconsistent_events():
    plan = tiny("naive", steps=1)
    s = Scheduler(plan)
    with pytest.raises(SchedulerError, match="start"):
        s.on_event(Committed(0.0, 0))
    acts = s.start(1.0)
    with pytest.raises(SchedulerError, match="not running"):
        s.on_event(FragmentGenerated(2.0, acts[0].fragment, "g1"))
    with pytest.raises(SchedulerError, match="before"):
        s.on_event(FragmentGenerated(0.5, acts[0].fragment, "g0"))
    with pytest.raises(SchedulerError, match="unexpected Committed"):
        s.on_event(Committed(2.0, 0))


def test_tag_modes_need_a_cost_model_and_plans_are_validated():
    with pytest.raises(ValueError, match="cost"):
        Scheduler(tiny("gap_tsp_tag"))
    with pytest.raises(PlanError, match="mode"):
        tiny("fast")
    with pytest.raises(PlanError, match="trained_timesteps"):
        tiny("gap", S=3, T=2)
    with pytest.raises(PlanError, match="generators"):
        StepPlan(1, 1, 1, 1, 1, 1, 1, ("a",), ("b",), "colocated", 1)
    with pytest.raises(PlanError, match="unique"):
        StepPlan(1, 1, 1, 1, 1, 1, 1, ("a",), ("a",), "gap", 1)


def test_zero_steps_is_done_at_once():
    s = Scheduler(tiny("gap", steps=0))
    assert s.start(0.0) == [] and s.done


def test_minibatches_commit_each_and_publish_once():
    # gap, M = 2: group 0 (minibatch 0) done at 2 s, trained 2-2.5 s, commit 0 at 2.5-2.8 s (no publish);
    # group 1 (minibatch 1) done at 4 s, trained 4-4.5 s with the weights after commit 0, commit 1 to 4.8 s,
    # publish to 5.0 s: the same step time as M = 1 here, with two optimizer steps and one publish.
    res = simulate(tiny("gap", minibatches=2), HAND)
    assert res.makespan == pytest.approx(2 * 5.0)
    commits = [(t, a) for t, a in res.actions if a.__class__.__name__ == "Commit"]
    assert [(a.step, a.round, a.final) for _, a in commits] == [(0, 0, False), (0, 1, True), (1, 0, False),
                                                                (1, 1, True)]
    assert [t for t, _ in commits][:2] == pytest.approx([2.5, 4.5])
    assert sum(isinstance(a, Publish) for _, a in res.actions) == 2
    # the chunk of minibatch 1 is trained after commit 0 ended, in round 1
    trains = [(t, a.chunk) for t, a in res.actions if isinstance(a, Train) and a.chunk.step == 0]
    assert all(c.round == (1 if c.group == 1 else 0) for _, c in trains)
    assert min(t for t, c in trains if c.round == 1) >= 2.8 - 1e-9


def test_epochs_repeat_every_minibatch():
    plan = tiny("gap_tsp", minibatches=2, epochs=2)
    res = simulate(plan, HAND)
    rounds = sorted({(a.chunk.step, a.chunk.round, a.chunk.group) for _, a in res.actions if isinstance(a, Train)})
    assert rounds == [(k, r, r % 2) for k in range(2) for r in range(4)]
    assert all(s.commits == 4 for s in res.stats)


def test_no_tag_after_a_minibatch_commit():
    # 1 slow generator, 2 trainer ranks: TAG fills the bubbles of round 0 only; after commit 0 the trainers'
    # weights are no longer the published version, so the rest of the step waits for the generator.
    plan = tiny("gap_tsp_tag", prompts=4, generations=2, n_gen=1, minibatches=2, steps=1)
    sched = Scheduler(plan, cost=HAND)
    res = simulate(plan, HAND)
    first_commit = next(t for t, a in res.actions if a.__class__.__name__ == "Commit")
    tags = [t for t, a in res.actions if isinstance(a, Generate) and a.tag]
    assert tags and max(tags) < first_commit
    assert sched is not None
