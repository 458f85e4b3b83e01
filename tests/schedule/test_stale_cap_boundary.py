"""TCSS's cap is inclusive: a step may hold exactly floor(max_stale_fraction x B) stale generations (issue 40: a
boundary only a cap that a fragment fills exactly reaches). With generators that would otherwise idle, the cap
is reached, never passed."""

from __future__ import annotations

import pytest

from digenrl.sim.executor import simulate
from test_sched_hand import HAND, tiny


@pytest.mark.parametrize("stale", [0.25, 0.5])
def test_the_stale_cap_is_reached_exactly(stale):
    plan = tiny("full", steps=4, stale=stale)  # B = 4 trajectories, fragments of 1: cap 1 or 2
    assert plan.stale_cap == int(stale * 4)
    res = simulate(plan, HAND)
    per_step = [s.stale_generations for s in res.stats]
    assert max(per_step) == plan.stale_cap, per_step
