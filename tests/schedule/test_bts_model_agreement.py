"""BTS's two models of the scheduling policy, checked step by step against the ``Scheduler`` run in virtual time.

At the first bubble of a step the policy inserts k TAG actions (each a gang of up to ``shard_ranks`` fragments
on a shard group), then skips every later bubble. The exact model (``StepModel.predict_commit``) must predict
the realized end of the step's commit to the last bit; the search's abstract dynamics (``TickModel.advance``
then ``leaf``) must predict it exactly in ticks when every cost is a whole number of ticks. A change to the
dispatch, the chunk order or the gang rule that a model does not follow fails here.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pytest

from digenrl.schedule import BTS, BTSConfig, Mode
from digenrl.schedule.audit import audit
from digenrl.schedule.bts import Decision
from digenrl.schedule.bts_model import TickModel
from digenrl.schedule.layout import Fragment
from digenrl.sim.executor import simulate
from sched_helpers import LinCost, make_plan


def _int_cost(draw) -> LinCost:
    """Whole-second costs (so that a 1 s tick is exact), every action at least one tick."""
    i = lambda lo, hi: draw(st.integers(lo, hi))  # noqa: E731
    return LinCost({"denoise": (i(0, 2), i(1, 3)), "vae_decode": (i(0, 1), i(0, 1)), "train_chunk": (i(1, 3), i(0, 2)),
                    "allreduce": (i(0, 2), 0), "optimizer": (i(1, 2), 0), "publish": (i(1, 2), 0),
                    "tag_switch": (i(0, 2), 0)}, trainer_factor=draw(st.sampled_from([1.0, 2.0])))


@st.composite
def cases(draw):
    g = draw(st.integers(1, 6))
    ranks = draw(st.sampled_from([1, 2, 3, 4]))
    plan = make_plan(draw(st.sampled_from(["gap_tsp_tag", "full"])), prompts=draw(st.integers(1, 4)), generations=g,
                     fragment_size=draw(st.integers(1, g)), S=draw(st.integers(1, 2)), T=3,
                     cg=draw(st.integers(1, g)), cs=1, n_gen=draw(st.integers(1, 3)),
                     n_train=draw(st.integers(1, 3)), steps=2, shard_ranks=ranks, gang_groups=draw(st.booleans()),
                     publish_streams=draw(st.booleans()))
    return plan, _int_cost(draw), draw(st.integers(0, 3))


def _run_with_first_k(plan, cost, k_want):
    """Simulate; at each step's first bubble insert min(k_want, possible) TAG actions, then skip."""
    seen, first = set(), {}

    def decide(self, snap):
        if snap.step in seen:
            return Decision(0)
        seen.add(snap.step)
        k = min(k_want, len(snap.idle), len(snap.pending))
        first[snap.step] = (snap, k, self)
        return Decision(k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(BTS, "decide", decide)
        res = simulate(plan, cost, bts=BTSConfig(policy="bts"))  # (full's default, auto, is greedy)
    return res, first


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_models_predict_the_commit_the_scheduler_realizes(case):
    plan, cost, k_want = case
    res, first = _run_with_first_k(plan, cost, k_want)
    assert audit(plan, res.actions, res.events) == []
    realized = {s.step: s.committed for s in res.stats}
    for step, (snap, k, bts) in first.items():
        if plan.mode is Mode.FULL and step > 0:
            continue  # TCSS: stale work of this step was generated before the bubble, outside the models' view
        assert bts.model.predict_commit(snap, k) == realized[step]
        tm = TickModel(bts.model, 1.0)  # whole-second ticks: exact for these costs
        dt, nxt = tm.advance(tm.compress(snap), k)
        ticks = dt if nxt is None else dt + tm.leaf(nxt)
        assert snap.now + ticks * tm.q == pytest.approx(realized[step], abs=1e-9)


def test_a_gang_takes_up_to_one_fragment_per_rank_across_groups():
    # 1 generator, one shard group of 3 ranks, groups of 2 one-generation fragments: the generator takes the
    # first fragment, the trainer's first TAG action the next 3 (the rest of group 0 and all of group 1: one
    # action over two groups, ``Generate.more``), and both models predict the commit that follows
    plan = make_plan("gap_tsp_tag", prompts=3, generations=2, fragment_size=1, S=1, T=3, cg=2, cs=1, n_gen=1,
                     n_train=1, steps=1, shard_ranks=3)
    cost = LinCost({"denoise": (0, 1), "train_chunk": (1, 0), "optimizer": (1, 0)})
    res, first = _run_with_first_k(plan, cost, 1)
    tags = [a for _, a in res.actions if getattr(a, "tag", False)]
    assert tags[0].fragments == (Fragment(0, 0, (1,)), Fragment(0, 1, (0, 1)))
    assert tags[0].size().generations == 3 and res.stats[0].tag_fragments == sum(a.size().generations for a in tags)
    assert audit(plan, res.actions, res.events) == []
    snap, k, bts = first[0]
    assert bts.model.predict_commit(snap, k) == res.stats[0].committed
    tm = TickModel(bts.model, 1.0)
    dt, nxt = tm.advance(tm.compress(snap), k)
    assert snap.now + (dt if nxt is None else dt + tm.leaf(nxt)) == pytest.approx(res.stats[0].committed)


def test_a_narrow_gang_keeps_to_the_head_group():
    # the same run with plan.gang_groups off (tuning.gang_groups=false): the first gang is the rest of group 0
    plan = make_plan("gap_tsp_tag", prompts=3, generations=2, fragment_size=1, S=1, T=3, cg=2, cs=1, n_gen=1,
                     n_train=1, steps=1, shard_ranks=3, gang_groups=False)
    cost = LinCost({"denoise": (0, 1), "train_chunk": (1, 0), "optimizer": (1, 0)})
    res, first = _run_with_first_k(plan, cost, 1)
    tags = [a for _, a in res.actions if getattr(a, "tag", False)]
    assert tags[0].fragments == (Fragment(0, 0, (1,)),) and all(not a.more for a in tags)
    assert audit(plan, res.actions, res.events) == []
    snap, k, bts = first[0]
    assert bts.model.predict_commit(snap, k) == res.stats[0].committed
