"""``tuning.stale_hold`` (``schedule.stale_hold``): in ``full`` with a joined publish a free generator waits
instead of starting a stale fragment that would hold the publish up, when overrun x h > its wait."""

from __future__ import annotations

from dataclasses import replace

import pytest

from digenrl.config import ConfigError, load_config
from digenrl.schedule import Generate, Publish
from digenrl.schedule.audit import audit
from digenrl.schedule.bts_model import StepModel
from digenrl.schedule.cost import Durations
from digenrl.schedule.plan import PlanError
from digenrl.schedule.stale_hold import applies, hold
from digenrl.sim.executor import simulate

from sched_helpers import LinCost, make_plan

COST = LinCost({"denoise": (0.0, 1.0), "vae_decode": (0.1, 0.0), "train_chunk": (0.2, 0.3),
                "optimizer": (0.5, 0.0), "publish": (0.7, 0.0), "tag_switch": (0.2, 0.0)})


def _plan(h: float, joins: bool = True):
    plan = make_plan("full", prompts=4, generations=4, fragment_size=1, S=2, T=3, cg=2, cs=2, n_gen=3,
                     n_train=2, steps=6, stale=0.5, publish_joins=joins)
    return replace(plan, stale_hold=h)


def test_the_rule_is_overrun_times_h_against_the_wait():
    plan = _plan(2.0)
    model = StepModel(plan, Durations(plan, COST))
    d = model.dur.generate(1, False, False)        # 3 denoise steps + decode: 3.1 s
    assert d == pytest.approx(3.1)
    # free at t = 0, commit ends at C: overrun = 3.1 - C, wait = C; hold iff 2 (3.1 - C) > C, i.e. C < 2.0667
    assert hold(plan, model, 0.0, 1, 2.0, None)
    assert not hold(plan, model, 0.0, 1, 2.1, None)
    assert not hold(plan, model, 0.0, 1, 3.2, None)   # ends before the commit: never held
    assert not hold(replace(plan, stale_hold=0.5), model, 0.0, 1, 2.0, None)  # 0.5 x 1.1 < 2
    assert applies(plan) and not applies(_plan(0.0)) and not applies(_plan(2.0, joins=False))
    assert not applies(replace(plan, minibatches=2))


def _publish_waits(res):
    start = {a.version: t for t, a in res.actions if isinstance(a, Publish)}
    return [start[s.step + 1] - s.committed for s in res.stats]


def test_holding_takes_the_wait_out_of_the_publish_and_keeps_the_run_valid():
    free, held = simulate(_plan(0.0), COST), simulate(_plan(100.0), COST)
    for plan, res in ((_plan(0.0), free), (_plan(100.0), held)):
        assert audit(plan, res.actions, res.events) == []
    w_free, w_held = _publish_waits(free), _publish_waits(held)
    assert sum(w_free) > 1.0, "the scenario should make a joined publish wait for stale fragments"
    assert sum(w_held) < 0.5 * sum(w_free), (w_free, w_held)
    # the held fragments are generated later (on-policy after the publish): fewer stale, the same work
    assert held.stale_fraction < free.stale_fraction
    n = lambda res: sum(1 for _, a in res.actions if isinstance(a, Generate))
    assert n(held) == n(free)


def test_stale_hold_is_a_checked_plan_and_config_key():
    with pytest.raises(PlanError, match="stale_hold"):
        _plan(-1.0)
    with pytest.raises(PlanError, match="stale_hold"):
        _plan(float("inf"))
    with pytest.raises(ConfigError, match="stale_hold"):
        load_config(None, ["tuning.stale_hold=-0.5"])
    from digenrl.control.run_plan import plan_run
    cfg = load_config(None, ["runtime.mode=full", "runtime.generators=2", "runtime.publish=broadcast",
                                  "tuning.stale_hold=4"])
    assert plan_run(cfg).plan.stale_hold == 4.0
