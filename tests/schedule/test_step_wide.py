"""Step-wide advantages (global std, batch baseline) in the pipelined modes: no commit of a step before its last
reward (the trainers rescale by the whole step's statistics at the commit), also with several minibatches; the
BTS exact model predicts the round-0 commit that then waits
(``test_sched_tag_policy.test_prediction_with_minibatches_is_the_first_rounds_commit``, step_wide drawn)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from digenrl.schedule import Commit, FragmentGenerated
from digenrl.schedule.audit import audit
from digenrl.sim.executor import simulate
from sched_helpers import LinCost, make_plan


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=st.integers(2, 5), g=st.integers(1, 4), f=st.integers(1, 4), n_gen=st.integers(1, 3),
       n_train=st.integers(1, 3), mb=st.integers(1, 3), gen=st.floats(0.1, 3.0), cell=st.floats(0.01, 2.0),
       mode=st.sampled_from(["gap", "gap_tsp", "gap_tsp_tag", "full"]))
def test_no_commit_before_the_steps_last_reward(p, g, f, n_gen, n_train, mb, gen, cell, mode):
    cost = LinCost({"denoise": (0.0, gen), "train_chunk": (0.01, cell), "allreduce": (0.3, 0), "optimizer": (0.1, 0),
                    "publish": (0.2, 0), "tag_switch": (0.1, 0)})
    plan = make_plan(mode, prompts=p, generations=g, fragment_size=min(f, g), S=2, T=3, cg=2, cs=1, n_gen=n_gen,
                     n_train=n_train, steps=2, minibatches=min(mb, p))
    wide = replace(plan, step_wide=True)
    res = simulate(wide, cost)
    assert audit(wide, res.actions, res.events) == []
    last = {}
    for e in res.events:
        if isinstance(e, FragmentGenerated):
            last[e.fragment.step] = max(last.get(e.fragment.step, 0.0), e.time)
    commits = [(t, a) for t, a in res.actions if isinstance(a, Commit)]
    assert len(commits) == plan.steps * plan.rounds
    assert all(t >= last[a.step] - 1e-12 for t, a in commits)
    if plan.rounds > 1:  # the gate can only delay: the plain plan commits no later
        plain = {(a.step, a.round): t for t, a in simulate(plan, cost).actions if isinstance(a, Commit)}
        assert plain[(0, 0)] <= dict(((a.step, a.round), t) for t, a in commits)[(0, 0)] + 1e-12
