"""TAG decision policies: deterministic BTS budget, the greedy rule, the no-TAG rule, span prediction errors."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from digenrl.control.loop import run_loop
from digenrl.control.timeline import Timeline
from digenrl.schedule import BTS, BTSConfig, BTSStats, Decision, FixedRule, Mode, Scheduler
from digenrl.sim.executor import VirtualExecutor, simulate
from sched_helpers import LinCost, make_plan


def _gen_heavy():
    return LinCost({"denoise": (0.0, 1.0), "train_chunk": (0.05, 0.05), "allreduce": (0.2, 0),
                    "optimizer": (0.1, 0), "publish": (0.3, 0), "tag_switch": (0.2, 0)})


def _run(plan, cost, config, clock=None, jitter=0.0, seed=0):
    kw = {} if clock is None else {"bts_clock": clock}
    sched = Scheduler(plan, cost, config, **kw)
    timeline = Timeline(plan)
    end = run_loop(sched, VirtualExecutor(plan, cost, jitter, seed), timeline)
    return timeline.result(sched, end), sched


def _slow_clock(step_s: float):
    """A clock that advances ``step_s`` seconds every time it is read (a heavily loaded machine)."""
    t = [0.0]

    def clock():
        t[0] += step_s
        return t[0]
    return clock


PLAN = make_plan("gap_tsp_tag", prompts=4, generations=4, fragment_size=1, S=2, T=4, n_gen=2, n_train=3, steps=3)


@pytest.mark.parametrize("budget_nodes", [2000, 12])
def test_decisions_do_not_depend_on_the_clock(budget_nodes):
    """Same inputs -> same actions, whether each clock read takes a microsecond or ten seconds; also when the
    node budget binds (12 nodes: depth 2 cannot finish at every bubble)."""
    cfg = BTSConfig(depth=2, budget_nodes=budget_nodes)
    fast, s_fast = _run(PLAN, _gen_heavy(), cfg, _slow_clock(1e-6), jitter=0.1, seed=3)
    slow, s_slow = _run(PLAN, _gen_heavy(), cfg, _slow_clock(10.0), jitter=0.1, seed=3)
    assert fast.actions == slow.actions
    assert s_fast.bts_stats.inserted == s_slow.bts_stats.inserted > 0
    if budget_nodes == 12:
        assert s_fast.bts_stats.budget_hits > 0  # the budget did bind, deterministically
    assert s_fast.bts_stats.budget_hits == s_slow.bts_stats.budget_hits


def test_wall_clock_cap_is_optional_and_off_by_default():
    assert BTSConfig().budget_s is None
    _, sched = _run(PLAN, _gen_heavy(), BTSConfig(), _slow_clock(100.0))
    assert sched.bts_stats.budget_hits == 0
    _, capped = _run(PLAN, _gen_heavy(), BTSConfig(budget_s=1.0), _slow_clock(100.0))
    assert capped.bts_stats.skip_fallbacks == capped.bts_stats.decisions > 0 and capped.bts_stats.inserted == 0


def _first_snapshot(plan, cost):
    snaps = []
    orig = BTS.decide

    def spy(self, snap):
        snaps.append(snap)
        return orig(self, snap)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(BTS, "decide", spy)
        simulate(plan, cost, record=False)
    return snaps


def test_budget_cut_falls_back_to_the_deepest_complete_depth():
    """A budget that fits exactly the depth-0 search: the decision is the depth-0 decision (not SkipBubble),
    reported as a budget hit at depth 0; one node: SkipBubble."""
    cost = _gen_heavy()
    snaps = [s for s in _first_snapshot(PLAN, cost) if min(len(s.idle), len(s.pending)) >= 2]
    assert snaps
    for snap in snaps[:5]:
        d0 = BTS(PLAN, cost, BTSConfig(depth=0)).decide(snap)
        full = BTS(PLAN, cost, BTSConfig(depth=3))
        deep = full.decide(snap)
        assert deep.depth == 3 and deep.nodes > d0.nodes
        cut = BTS(PLAN, cost, BTSConfig(depth=3, budget_nodes=d0.nodes))
        got = cut.decide(snap)
        assert (got.k, got.depth) == (d0.k, 0) and cut.stats.budget_hits == 1 and cut.stats.skip_fallbacks == 0
        one = BTS(PLAN, cost, BTSConfig(depth=3, budget_nodes=1))
        assert one.decide(snap).k == 0 and one.stats.skip_fallbacks == 1


def test_greedy_gives_one_fragment_per_idle_rank_while_pending():
    """At every bubble the greedy rule hands min(idle ranks, pending fragments) fragments to trainer ranks,
    counted from the actions the scheduler emits (and from the snapshot it saw)."""
    seen = []
    orig_bubble = Scheduler._bubble

    def spy(self, t):
        idle = sum(1 for r in self.plan.trainers if self._idle(r))
        pending = len(self._work(self.train_step).pending)
        acts = orig_bubble(self, t)
        seen.append((idle, pending, sum(1 for a in acts if getattr(a, "tag", False))))
        return acts

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Scheduler, "_bubble", spy)
        res = simulate(PLAN, _gen_heavy(), bts=BTSConfig(policy="greedy"), record=False)
    bubbles = [x for x in seen if x[1] > 0]
    assert bubbles and any(k > 1 for _, _, k in bubbles)
    assert all(k == min(idle, pending) for idle, pending, k in bubbles), bubbles
    assert res.bts["inserted"] == sum(k for _, _, k in bubbles) == res.tag_fragments_per_step * PLAN.steps
    assert res.bts["predictions"] == 0  # the rule predicts nothing


def test_greedy_rule_on_a_snapshot():
    rule = FixedRule(greedy=True)
    snaps = _first_snapshot(PLAN, _gen_heavy())
    for s in snaps:
        assert rule.decide(s).k == min(len(s.idle), len(s.pending))
    assert all(FixedRule(greedy=False).decide(s).k == 0 for s in snaps)


def test_policy_none_runs_like_the_mode_without_tag():
    """``none`` in a TAG mode: no TAG fragment, and the run equals gap_tsp (the mode without TAG) exactly."""
    cost = _gen_heavy()
    none = simulate(PLAN, cost, bts=BTSConfig(policy="none"))
    base = simulate(replace(PLAN, mode=Mode.GAP_TSP), cost)
    assert none.tag_fragments_per_step == 0 and none.bts["decisions"] > 0
    assert none.makespan == base.makespan


OPS = ("denoise", "vae_decode", "reward", "transfer", "train_chunk", "allreduce", "optimizer", "publish",
       "tag_switch")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=st.integers(1, 4), g=st.integers(1, 4), f=st.integers(1, 4), n_gen=st.integers(1, 3),
       n_train=st.integers(1, 4), coefs=st.lists(st.floats(0.0, 2.0), min_size=len(OPS) * 2, max_size=len(OPS) * 2),
       depth=st.integers(0, 3), budget=st.sampled_from([1, 3, 10, 40, 2000]), mode=st.sampled_from(["gap_tsp_tag",
                                                                                                  "full"]))
def test_bts_never_predicts_worse_than_skip_bubble(p, g, f, n_gen, n_train, coefs, depth, budget, mode):
    """With exact costs, at every decision (whatever the depth and the node budget) the chosen k's exact
    no-TAG-afterwards prediction is no later than SkipBubble's (k = 0 is always a candidate); and the TAG run
    of ``gap_tsp_tag`` is never slower than ``gap_tsp``."""
    coef = {op: (coefs[2 * i], coefs[2 * i + 1] if op in ("denoise", "vae_decode", "reward", "transfer",
                                                             "train_chunk") else 0.0) for i, op in enumerate(OPS)}
    coef["denoise"] = (coef["denoise"][0], coef["denoise"][1] + 0.05)
    coef["train_chunk"] = (coef["train_chunk"][0] + 0.01, coef["train_chunk"][1])
    cost = LinCost(coef)
    plan = make_plan(mode, prompts=p, generations=g, fragment_size=min(f, g), S=2, T=2, cg=1, cs=1,
                     n_gen=n_gen, n_train=n_train, steps=2)
    checks = []
    orig = BTS.decide

    def spy(self, snap):
        d = orig(self, snap)
        assert 0 in self.candidates(min(len(snap.idle), len(snap.pending)))
        checks.append(self.model.predict_commit(snap, d.k) <= self.model.predict_commit(snap, 0))
        return d

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(BTS, "decide", spy)
        res = simulate(plan, cost, bts=BTSConfig(policy="bts", depth=depth, budget_nodes=budget), record=False)
    assert all(checks)
    if mode == "gap_tsp_tag":
        assert res.makespan <= simulate(replace(plan, mode=Mode.GAP_TSP), cost, record=False).makespan


def test_span_error_is_relative_to_the_predicted_span():
    s = BTSStats()
    s.predicted, s.decided_at, s.realized = {0: 110.0, 1: 230.0}, {0: 100.0, 1: 200.0}, {0: 111.0, 1: 227.0}
    out = s.summary()
    # step 0: span 10 s, off by +1 s -> 10 %; step 1: span 30 s, off by -3 s -> -10 %
    assert out["span_rel_error_mean"] == pytest.approx(0.10)
    assert out["span_rel_error_max"] == pytest.approx(0.10)
    assert out["span_rel_bias"] == pytest.approx(0.0)
    assert out["makespan_rel_error_mean"] == pytest.approx((1 / 111 + 3 / 227) / 2)


def test_bts_records_the_span_of_each_steps_first_decision():
    res, sched = _run(PLAN, _gen_heavy(), BTSConfig())
    st_ = sched.bts_stats
    assert set(st_.predicted) == set(st_.decided_at) == set(range(PLAN.steps))
    for step, pred in st_.predicted.items():
        assert st_.decided_at[step] < pred
        assert res.stats[step].first_dispatch <= st_.decided_at[step] <= res.stats[step].committed
    assert res.bts["predictions"] == PLAN.steps


def test_policy_and_budget_validation():
    with pytest.raises(ValueError, match="policy"):
        BTSConfig(policy="gredy")
    with pytest.raises(ValueError, match="budget_nodes"):
        BTSConfig(budget_nodes=0)
    with pytest.raises(ValueError, match="budget_s"):
        BTSConfig(budget_s=0.0)


def test_config_keys_reach_the_scheduler_config():
    from digenrl.config import Config, ConfigError

    cfg = Config.model_validate({"runtime": {"tag_policy": "greedy"},
                                 "tuning": {"bts": {"depth": 4, "budget_nodes": 77}}})
    b = cfg.bts_config()
    assert (b.policy, b.depth, b.budget_nodes, b.budget_s) == ("greedy", 4, 77, None)
    assert Config().bts_config() == BTSConfig()
    with pytest.raises((ValueError, ConfigError), match="tag_policy"):
        Config.model_validate({"runtime": {"tag_policy": "always"}})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=st.integers(2, 5), g=st.integers(1, 4), f=st.integers(1, 4), n_gen=st.integers(1, 3),
       n_train=st.integers(1, 3), gen=st.floats(0.1, 3.0), cell=st.floats(0.01, 2.0), mb=st.integers(2, 3),
       step_wide=st.booleans())
def test_prediction_with_minibatches_is_the_first_rounds_commit(p, g, f, n_gen, n_train, gen, cell, mb, step_wide):
    """Several minibatch rounds per step: at every bubble, predict_commit(snapshot, 0) equals the realized end
    of round 0's commit when BTS always skips (the exact check compares what really happens first), also when
    the plan is step-wide and that commit waits for the step's last reward."""
    from digenrl.schedule import Committed

    mb = min(mb, p)
    cost = LinCost({"denoise": (0.0, gen), "train_chunk": (0.01, cell), "allreduce": (0.3, 0), "optimizer": (0.1, 0),
                    "publish": (0.2, 0), "tag_switch": (0.1, 0)})
    plan = make_plan("gap_tsp_tag", prompts=p, generations=g, fragment_size=min(f, g), S=2, T=3, cg=2, cs=1,
                     n_gen=n_gen, n_train=n_train, steps=2, minibatches=mb)
    plan = replace(plan, step_wide=step_wide)
    predictions = []

    def skip(self, snap):
        predictions.append((snap.step, self.model.predict_commit(snap, 0)))
        return Decision(0)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(BTS, "decide", skip)
        res = simulate(plan, cost)
    first = {e.step: e.time for e in res.events if isinstance(e, Committed) and e.round == 0}
    for step, pred in predictions:
        assert pred == first[step]


def test_auto_is_greedy_with_tcss_and_bts_otherwise():
    """The default policy, ``auto``: the same actions as ``greedy`` in ``full`` and as ``bts`` in ``gap_tsp_tag``
    (``benchmarks/bts_quality.py``: the faster policy on average in each mode), from the config too."""
    from digenrl.config import Config

    assert BTSConfig().policy == "auto" and Config().bts_config().policy == "auto"
    for mode, same, other in (("full", "greedy", "bts"), ("gap_tsp_tag", "bts", "greedy")):
        plan = make_plan(mode, prompts=4, generations=4, fragment_size=1, S=2, T=4, n_gen=2, n_train=2, steps=3)
        auto, _ = _run(plan, _gen_heavy(), BTSConfig(), jitter=0.2, seed=1)
        want, _ = _run(plan, _gen_heavy(), BTSConfig(policy=same), jitter=0.2, seed=1)
        not_, _ = _run(plan, _gen_heavy(), BTSConfig(policy=other), jitter=0.2, seed=1)
        assert auto.actions == want.actions
        assert auto.actions != not_.actions  # the two policies differ on this plan, so the check has teeth
