"""Property-based checks of the invariants (docs/architecture.md, "Invariants") over random plans, pools, costs, jitter."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from digenrl.schedule import MODES, BTSConfig, Mode
from digenrl.schedule.audit import audit
from digenrl.sim.executor import simulate
from sched_helpers import LinCost, make_plan

OPS = ("denoise", "vae_decode", "reward", "transfer", "train_chunk", "allreduce", "optimizer", "publish",
       "tag_switch")


@st.composite
def costs(draw):
    coef = {}
    for op in OPS:
        fixed = draw(st.floats(0.0, 2.0, allow_nan=False))
        per = draw(st.floats(0.0, 2.0, allow_nan=False)) if op not in ("allreduce", "optimizer", "publish",
                                                                       "tag_switch") else 0.0
        coef[op] = (fixed, per)
    # at least one op with a positive duration per action kind, so time advances
    coef["denoise"] = (coef["denoise"][0], coef["denoise"][1] + 0.05)
    coef["train_chunk"] = (coef["train_chunk"][0] + 0.01, coef["train_chunk"][1])
    return LinCost(coef, trainer_factor=draw(st.sampled_from([0.5, 1.0, 2.0])))


@st.composite
def plans(draw, modes=MODES, max_workers=4, max_prompts=4, minibatches=True):
    mode = draw(st.sampled_from(modes))
    g = draw(st.integers(1, 6))
    t = draw(st.integers(1, 5))
    s = draw(st.integers(1, t))
    prompts = draw(st.integers(1, max_prompts))
    m = draw(st.sampled_from([1, 1, 2, prompts])) if minibatches else 1
    return make_plan(mode, prompts=prompts, generations=g, minibatches=min(m, prompts),
                     epochs=draw(st.sampled_from([1, 1, 2])) if minibatches else 1,
                     fragment_size=draw(st.integers(1, g)), S=s, T=t, cg=draw(st.integers(1, g)),
                     cs=draw(st.integers(1, s)), n_gen=draw(st.integers(1, max_workers)),
                     n_train=draw(st.integers(1, max_workers)), steps=draw(st.integers(1, 3)),
                     stale=draw(st.sampled_from([0.0, 0.1, 0.34, 0.5, 1.0])), publish_joins=draw(st.booleans()),
                     publish_streams=draw(st.booleans()))


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(plan=plans(), cost=costs(), jitter=st.sampled_from([0.0, 0.0, 0.3]), seed=st.integers(0, 10),
       policy=st.sampled_from(["auto", "bts", "greedy"]))
def test_invariants_hold_in_every_mode(plan, cost, jitter, seed, policy):
    res = simulate(plan, cost, jitter=jitter, seed=seed, bts=BTSConfig(policy=policy))
    problems = audit(plan, res.actions, res.events)
    assert problems == [], problems[:5]
    # every step terminates, and the run's accounting matches the plan
    assert all(s.committed is not None and s.published is not None for s in res.stats)
    assert all(s.commits == plan.rounds for s in res.stats)  # one optimizer step per minibatch and epoch
    assert sum(s.fragments for s in res.stats) == plan.steps * plan.prompts * plan.fragments_per_group
    assert all(s.stale_generations <= plan.stale_cap for s in res.stats)
    if plan.mode is not Mode.FULL:
        assert res.stale_fraction == 0.0
    if not plan.mode.tag:
        assert res.tag_fragments_per_step == 0.0
    # busy time never exceeds capacity
    assert 0.0 <= res.gen_idle <= 1.0 and 0.0 <= res.trainer_idle <= 1.0


def _tag_not_slower(plan, cost):
    base = simulate(plan, cost, record=False)
    with_tag = simulate(replace(plan, mode=Mode.GAP_TSP_TAG), cost, record=False)
    assert with_tag.makespan <= base.makespan * (1 + 1e-12) + 1e-12, (with_tag.makespan, base.makespan)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=plans(modes=("gap_tsp",)), cost=costs())
def test_tag_never_slower_than_tsp_with_exact_costs(plan, cost):
    _tag_not_slower(plan, cost)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=plans(modes=("gap_tsp",), max_workers=10, max_prompts=8), cost=costs())
def test_tag_never_slower_than_tsp_on_larger_pools(plan, cost):
    _tag_not_slower(plan, cost)


@settings(max_examples=40, deadline=None)
@given(plan=plans(modes=("full",)), cost=costs())
def test_tcss_respects_cap_and_staleness_one(plan, cost):
    res = simulate(plan, cost)
    for t, a in res.actions:
        if hasattr(a, "fragment"):
            assert a.version in (a.fragment.step, a.fragment.step - 1)
    assert res.stale_fraction <= plan.max_stale_fraction + 1e-12
