"""Actions describe themselves (``schedule.actions``): a distinct ``kind`` per class that the cost model prices,
``workers`` equal to what the scheduler holds for them in a run, and spans whose ``size`` a cost profile is read
from. The expectations are written here from the rules (docs/architecture.md, DESIGN 2.3-2.5), not taken from
the code under test."""

from __future__ import annotations

import math
from dataclasses import fields

import pytest

from digenrl.control.loop import run_loop
from digenrl.control.observed import observed_profile
from digenrl.control.profile import ProfileCost
from digenrl.control.timeline import Timeline
from digenrl.schedule import Commit, Durations, Generate, Publish, Scheduler, Train
from digenrl.schedule.bts import BTSConfig
from digenrl.schedule.online_cost import KINDS as ONLINE_KINDS
from digenrl.sim.executor import JITTER_KINDS, VirtualExecutor, simulate

from sched_helpers import LinCost, make_plan

CLASSES = (Generate, Train, Commit, Publish)
COST = LinCost({"denoise": (0.01, 0.02), "vae_decode": (0.1, 0.01), "reward": (0.03, 0.002),
                "transfer": (0.02, 0.001), "train_chunk": (0.2, 0.3), "allreduce": (0.1, 0.0),
                "optimizer": (0.5, 0.0), "publish": (0.7, 0.0), "tag_switch": (0.2, 0.0)})


def test_every_action_class_has_its_own_kind_and_the_cost_model_prices_it():
    kinds = [c.kind for c in CLASSES]
    assert kinds == ["generate", "train", "commit", "publish"]  # one string constant per class
    assert len(set(kinds)) == len(kinds)
    assert tuple(kinds) == JITTER_KINDS  # the simulator's jitter kinds
    for k in kinds:
        assert callable(getattr(Durations, k, None)), k  # the cost model's price of an action of that kind
        assert k in ONLINE_KINDS or {f"{k}/generator", f"{k}/trainer"} <= set(ONLINE_KINDS), k
    assert all("kind" not in {f.name for f in fields(c)} for c in CLASSES)  # a class constant, not a field


# ---- workers: what the scheduler holds -----------------------------------------------------------------------

class _Recorder:
    """The control loop's timeline hooks: (start, action) and the completions."""

    def __init__(self):
        self.log, self.done = [], []

    def launched(self, actions, t):
        self.log.extend((t, a) for a in actions)
        return actions

    def record(self, c):
        self.done.append(c)


def _expected_workers(plan, a) -> set[str]:
    """DESIGN 2, 2.3, 2.5 and ``StepPlan``: a fragment holds its worker, a chunk its rank, a commit every trainer
    rank; a publish holds the trainer ranks unless it is streamed (they only start their sends) and the
    generators when they join it (a broadcast or a stream); an object-store publish leaves them free."""
    if isinstance(a, Generate):
        return {a.worker}
    if isinstance(a, Train):
        return {a.rank}
    if isinstance(a, Commit):
        return set(plan.trainers)
    return (set() if plan.publish_streams else set(plan.trainers)) | (
        set(plan.generators) if plan.publish_joins else set())


PLANS = {
    "gap_tsp_tag/object store": make_plan("gap_tsp_tag", prompts=3, generations=4, n_gen=2, n_train=2, steps=3),
    "full/object store": make_plan("full", prompts=4, generations=4, fragment_size=1, S=2, cg=2, cs=2, n_gen=3,
                                   n_train=2, steps=4, stale=0.5),
    "full/broadcast": make_plan("full", prompts=4, generations=4, fragment_size=1, S=2, cg=2, cs=2, n_gen=3,
                                n_train=2, steps=4, stale=0.5, publish_joins=True),
    "full/stream": make_plan("full", prompts=4, generations=4, fragment_size=1, S=2, cg=2, cs=2, n_gen=3,
                             n_train=2, steps=4, stale=0.5, publish_streams=True),
    "colocated": make_plan("colocated", prompts=2, generations=4, n_train=2, steps=2),
}


# generation the bottleneck and a long publish: the workers a collective leaves free have work during it
HOLD_COST = LinCost({"denoise": (0.0, 1.0), "vae_decode": (0.1, 0.0), "train_chunk": (0.2, 0.3),
                     "allreduce": (0.1, 0.0), "optimizer": (0.5, 0.0), "publish": (2.5, 0.0), "tag_switch": (0.2, 0.0)})


@pytest.mark.parametrize("name", list(PLANS))
def test_workers_are_what_the_scheduler_holds(name):
    plan = PLANS[name]
    cost = HOLD_COST
    rec = _Recorder()
    run_loop(Scheduler(plan, cost=cost, bts_config=BTSConfig(policy="greedy")), VirtualExecutor(plan, cost), rec)
    end = {id(c.action): c.end for c in rec.done}
    assert len(end) == len(rec.log) > 0
    free_used = {c.kind: set() for c in CLASSES}  # workers outside an action's set that got work while it ran
    work = {id(c.action): {i.worker for i in c.work} for c in rec.done}
    spans = [(t, end[id(a)], a, _expected_workers(plan, a)) for t, a in rec.log]
    for t, e, a, want in spans:
        assert set(a.workers) == want and len(a.workers) == len(want), (a, a.workers, want)
        assert work[id(a)] == want  # the executor holds them for the action's time
    for i, (t, e, a, want) in enumerate(spans):  # no two actions hold a worker at once
        for t2, e2, b, want2 in spans[i + 1:]:
            if max(t, t2) < min(e, e2):
                assert not want & want2, f"{a} [{t}, {e}) and {b} [{t2}, {e2}) both hold {want & want2}"
                free_used[a.kind] |= want2
                free_used[b.kind] |= want
    # the rule is not wider than the scheduler's: the workers a collective leaves free do work during one
    if plan.mode.tcss and not plan.publish_joins:
        assert set(plan.generators) <= free_used["publish"]
    if plan.publish_streams:
        assert set(plan.trainers) & free_used["publish"]
    if plan.mode.tcss:
        assert set(plan.generators) <= free_used["commit"]


# ---- profile_observed.json from the spans' sizes ----------------------------------------------------------------

def test_the_observed_profile_of_a_simulated_run_prices_every_size_the_run_used():
    """With exact costs and no dispatch gap (``max_gap_s=0``) the profile read off the spans gives back the cost
    model at every size the run used: a fragment of n generations on pool p lasted T denoise(n) + vae_decode(n)
    + reward(n) + transfer(n) (its switch is a span apart), so its denoise entry is that / T; a chunk of c cells
    train_chunk(c); a commit allreduce + optimizer; a publish publish(1)."""
    T = 3
    plan = make_plan("gap_tsp_tag", prompts=3, generations=6, fragment_size=4, S=3, T=T, cg=4, cs=2, n_gen=1,
                     n_train=2, steps=3)
    res = simulate(plan, COST, bts=BTSConfig(policy="greedy"))
    prof = ProfileCost.from_dict(observed_profile(res.spans, T, max_gap_s=0.0))
    acts = [a for _, a in res.actions]
    gens = {(len(f.generations), "trainer" if a.tag else "generator") for a in acts if isinstance(a, Generate)
            for f in [a.fragment] if not a.more}
    cells = {len(a.chunk.cells) for a in acts if isinstance(a, Train)}
    assert {n for n, _ in gens} == {4, 2} and "trainer" in {p for _, p in gens} and len(cells) >= 2  # sizes differ
    tags = [a for a in acts if isinstance(a, Generate) and a.tag]
    assert sum(s.kind == "tag" for s in res.spans) == len(tags) > 0  # a TAG fragment's span is a "tag" span

    def frag(n, pool):
        return sum((T if op == "denoise" else 1) * COST.time(op, n, pool)
                   for op in ("denoise", "vae_decode", "reward", "transfer"))

    for n, pool in gens:
        assert T * prof.time("denoise", n, pool) == pytest.approx(frag(n, pool)), (n, pool)
    for c in cells:
        assert prof.time("train_chunk", c, "trainer") == pytest.approx(COST.time("train_chunk", c, "trainer")), c
    assert prof.time("optimizer", 1, "trainer") == pytest.approx(0.1 + 0.5)
    assert prof.time("publish", 1, "trainer") == pytest.approx(0.7)
    assert all(math.isclose(prof.time("reward", n, p), 0.0, abs_tol=1e-12) for n, p in gens)  # no gap
