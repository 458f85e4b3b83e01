"""A publish the generators join (``StepPlan.publish_joins``, ``runtime.publish=broadcast``): it starts only once
every generator is free, no generator works while it waits or runs, and the audit catches one that does."""

from __future__ import annotations

from dataclasses import replace

from digenrl.schedule import Generate, Publish
from digenrl.schedule.audit import audit
from digenrl.sim.executor import simulate

from sched_helpers import LinCost, make_plan

# TCSS keeps the generators busy with next-step fragments at every commit: a joined publish has to wait
COST = LinCost({"denoise": (0.0, 1.0), "vae_decode": (0.1, 0.0), "train_chunk": (0.2, 0.3),
                "optimizer": (0.5, 0.0), "publish": (0.7, 0.0), "tag_switch": (0.2, 0.0)})


def _plan(joins: bool):
    return make_plan("full", prompts=4, generations=4, fragment_size=1, S=2, T=3, cg=2, cs=2, n_gen=3,
                     n_train=2, steps=4, stale=0.5, publish_joins=joins)


def _intervals(res):
    end = {}
    for e in res.events:
        if hasattr(e, "fragment"):
            end[("g", e.fragment)] = e.time
        elif hasattr(e, "version"):
            end[("p", e.version)] = e.time
    gens, pubs = [], []
    for t, a in res.actions:
        if isinstance(a, Generate) and not a.tag:
            gens.append((t, end[("g", a.fragment)], a.worker))
        elif isinstance(a, Publish):
            pubs.append((t, end[("p", a.version)]))
    return gens, pubs


def _overlaps(gens, pubs):
    return [(g, p) for g in gens for p in pubs if g[0] < p[1] - 1e-12 and p[0] < g[1] - 1e-12]


def test_object_store_publish_runs_beside_busy_generators():
    """The scenario exercises the case: without joining, publishes overlap in-flight generator work."""
    res = simulate(_plan(False), COST)
    gens, pubs = _intervals(res)
    assert _overlaps(gens, pubs), "the scenario should keep a generator busy across a publish"
    assert audit(_plan(False), res.actions, res.events) == []


def test_joined_publish_waits_for_every_generator_and_holds_them():
    plan = _plan(True)
    res = simulate(plan, COST)
    gens, pubs = _intervals(res)
    assert len(pubs) == plan.steps
    assert _overlaps(gens, pubs) == []
    assert audit(plan, res.actions, res.events) == []
    # the wait is real: some publish starts later than its step's commit ended
    committed = [s.committed for s in res.stats]
    assert any(p[0] > c + 1e-9 for p, c in zip(pubs, committed))
    # while it waits, no generator takes new work (each one joins as soon as its fragment is done)
    started_while_waiting = [g for g in gens for p, c in zip(pubs, committed) if c - 1e-12 < g[0] < p[0] - 1e-12]
    assert started_while_waiting == []
    # and the generators are shown in the publish (a collective they take part in)
    assert any(sp.kind == "publish" and sp.worker in plan.generators for sp in res.spans)


def test_audit_rejects_generator_work_inside_a_joined_publish():
    res = simulate(_plan(False), COST)
    problems = audit(replace(_plan(False), publish_joins=True), res.actions, res.events)
    assert any("runs two actions at once" in p and p.split()[1].startswith("g") for p in problems), problems


def test_trainers_fill_the_join_wait_with_next_step_chunks_that_end_in_time():
    """While the joined publish waits, trainer ranks train ready chunks of the next step (TCSS groups, with the
    committed weights) only if each ends by the last generator's predicted end (exact costs here)."""
    from digenrl.schedule import Train

    cost = LinCost({"denoise": (0.0, 3.0), "vae_decode": (0.1, 0.0), "train_chunk": (0.2, 0.1),
                    "optimizer": (0.5, 0.0), "publish": (0.7, 0.0), "tag_switch": (0.2, 0.0)})
    plan = make_plan("full", prompts=4, generations=4, fragment_size=2, S=2, T=3, cg=1, cs=1, n_gen=4,
                     n_train=2, steps=4, stale=0.5, publish_joins=True)
    res = simulate(plan, cost)
    gens, pubs = _intervals(res)
    committed = [s.committed for s in res.stats]
    train_end = {}
    for e in res.events:
        if hasattr(e, "chunk"):
            train_end[(e.chunk, e.rank)] = e.time
    in_wait = [(t, train_end[(a.chunk, a.rank)], a.chunk.step, k) for t, a in res.actions if isinstance(a, Train)
               for k, (p, c) in enumerate(zip(pubs, committed)) if c - 1e-12 < t < p[0] - 1e-12]
    assert in_wait, "the scenario should leave room for a chunk inside a join wait"
    for start, end, step, k in in_wait:
        assert step == k + 1                  # a chunk of the next step, trained with the committed weights
    for k, (p, c) in enumerate(zip(pubs, committed)):  # no chunk held a publish up: it starts as the last
        in_flight = [g[1] for g in gens if g[0] < c < g[1]]  # generator in flight at the commit is done
        assert abs(p[0] - max([c] + in_flight)) < 1e-9, (k, p, c, in_flight)
    assert audit(plan, res.actions, res.events) == []
