"""TAG only before a step's first commit: after a minibatch's commit the trainer ranks' weights are no longer the
published version, so a TAG fragment generated then would be off-policy (I3). The guard is the scheduler's, not
the TAG policy's: it must hold for any policy, including one that takes every bubble (``greedy``)."""

from __future__ import annotations

import pytest

from digenrl.schedule import Commit, Generate
from digenrl.schedule.audit import audit
from digenrl.schedule.bts import BTSConfig
from digenrl.sim.executor import simulate
from sched_helpers import LinCost, make_plan

# Generate(n) = 2 n s on the one slow generator, Train(c) = 0.5 c s: trainers idle after each minibatch commit
HAND = LinCost({"denoise": (0.0, 1.0), "train_chunk": (0.0, 0.5), "allreduce": (0.2, 0), "optimizer": (0.1, 0),
                "publish": (0.2, 0), "tag_switch": (0.1, 0)})
PLANS = [dict(prompts=4, generations=2, fragment_size=1, minibatches=2),
         dict(prompts=4, generations=4, fragment_size=2, minibatches=4),
         dict(prompts=2, generations=8, fragment_size=1, minibatches=2, epochs=2)]


@pytest.mark.parametrize("policy", ["bts", "greedy"])
@pytest.mark.parametrize("kw", PLANS)
def test_no_tag_after_a_minibatch_commit_whatever_the_policy(policy, kw):
    plan = make_plan("gap_tsp_tag", S=1, T=2, cg=1, cs=1, n_gen=1, n_train=2, steps=2, **kw)
    res = simulate(plan, HAND, bts=BTSConfig(policy=policy))
    assert audit(plan, res.actions, res.events) == []
    first_commit = {}
    for t, a in res.actions:
        if isinstance(a, Commit):
            first_commit.setdefault(a.step, t)
    tags = [(t, a.fragment.step) for t, a in res.actions if isinstance(a, Generate) and a.tag]
    assert tags, "no TAG at all: the plan does not exercise the guard"
    late = [(t, k) for t, k in tags if t >= first_commit[k]]
    assert not late, late
