"""A streamed publish (``StepPlan.publish_streams``, ``runtime.publish=stream``): every sending rank broadcasts its
own shard while the trainers go on. The trainers pay their send in the step's final commit, are free during the
publish (they train the next step's ready chunks), and the next commit waits for the publish to end; the
generators are held by it as by a broadcast. The audit accepts that and nothing more."""

from __future__ import annotations

from dataclasses import replace

from digenrl.schedule import Commit, Publish, Published, Train
from digenrl.schedule.audit import audit
from digenrl.sim.executor import simulate

from sched_helpers import LinCost, make_plan

# TCSS groups of the next step are ready at the commit, and the generators' receive is long: the trainers have
# chunks to train while the generators are in the publish
COST = LinCost({"denoise": (0.0, 1.0), "vae_decode": (0.1, 0.0), "train_chunk": (0.2, 0.3), "allreduce": (0.1, 0.0),
                "optimizer": (0.5, 0.0), "tag_switch": (0.2, 0.0)})


class SplitPublish(LinCost):
    """The two sides of a streamed publish: the trainers' send (short) and the generators' receive (long)."""

    def time(self, op, batch, pool):
        if op == "publish":
            return 0.05 if pool == "trainer" else 2.5
        return super().time(op, batch, pool)


def _plan(streams: bool):
    return make_plan("full", prompts=4, generations=4, fragment_size=1, S=2, T=3, cg=2, cs=2, n_gen=3, n_train=2,
                     steps=4, stale=0.5, publish_joins=True, publish_streams=streams)


def _ends(res):
    out = {}
    for e in res.events:
        if hasattr(e, "chunk"):
            out[("t", e.chunk, e.rank)] = e.time
        elif hasattr(e, "version"):
            out[("p", e.version)] = e.time
        elif hasattr(e, "round"):
            out[("c", e.step, e.round)] = e.time
    return out


def _trained_inside_publishes(res):
    end = _ends(res)
    pubs = [(t, end[("p", a.version)]) for t, a in res.actions if isinstance(a, Publish)]
    trains = [(t, end[("t", a.chunk, a.rank)]) for t, a in res.actions if isinstance(a, Train)]
    return [(tr, p) for tr in trains for p in pubs if tr[0] < p[1] - 1e-12 and p[0] < tr[1] - 1e-12]


def test_trainers_train_while_a_streamed_publish_runs_and_the_audit_accepts_it():
    cost = SplitPublish(COST.coef)
    res = simulate(_plan(True), cost)
    assert _trained_inside_publishes(res), "the trainers should train beside the stream"
    assert audit(_plan(True), res.actions, res.events) == []
    # the same log is a violation where the publish holds the trainers (a broadcast)
    problems = audit(replace(_plan(True), publish_streams=False), res.actions, res.events)
    assert any("runs two actions at once" in p and p.split()[1].startswith("t") for p in problems), problems
    # and a broadcast run keeps them out of the publish
    joined = simulate(_plan(False), cost)
    assert _trained_inside_publishes(joined) == []
    assert audit(_plan(False), joined.actions, joined.events) == []


def test_the_sends_are_in_the_final_commit_the_receive_in_the_publish():
    cost = SplitPublish(COST.coef)
    plan = replace(_plan(True), minibatches=2)  # two commits per step: only the second carries the sends
    res = simulate(plan, cost)
    end = _ends(res)
    for t, a in res.actions:
        if isinstance(a, Commit):
            want = 0.1 + 0.5 + (0.05 if a.final else 0.0)
            assert abs((end[("c", a.step, a.round)] - t) - want) < 1e-9, a
        elif isinstance(a, Publish):
            assert abs((end[("p", a.version)] - t) - 2.5) < 1e-9
    assert {sp.worker for sp in res.spans if sp.kind == "publish"} == set(plan.generators)
    assert audit(plan, res.actions, res.events) == []


def test_the_next_commit_waits_for_the_stream_and_the_audit_checks_it():
    cost = SplitPublish(COST.coef)
    plan = _plan(True)
    res = simulate(plan, cost)
    end = _ends(res)
    commits = {(a.step, a.round): t for t, a in res.actions if isinstance(a, Commit)}
    for k in range(1, plan.steps):
        assert commits[(k, 0)] >= end[("p", k)] - 1e-12
    # a publish reported to end after the next commit began is flagged
    k = 2
    late = [replace(e, time=commits[(k, 0)] + 1.0) if isinstance(e, Published) and e.version == k else e
            for e in res.events]
    problems = audit(plan, res.actions, late)
    # (the message numbers steps from 1: the scheduler's step k is step k + 1, which needs version k)
    assert any(f"step {k + 1} committed" in p and f"before version {k} was published" in p for p in problems), problems
