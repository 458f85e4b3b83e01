"""The packed colocated plan (``StepPlan.packed``, what ``digenrl train`` runs colocated): each worker takes its
share of the step's fragments in one generation action (a gang over the step's prompt groups) and trains its
shard of every group in chunks of the chunk shape; the unpacked plan (the planner presets' flow_grpo baseline)
keeps one fragment per action and one trained timestep per chunk. Both pass the audit."""

from __future__ import annotations

from dataclasses import replace

import pytest

from digenrl.schedule import Generate, PlanError, Train
from digenrl.schedule.audit import audit
from digenrl.schedule.layout import classic_shard, tile_grid
from digenrl.sim.executor import simulate

from sched_helpers import LinCost, make_plan

COST = LinCost({"denoise": (0.1, 0.05), "train_chunk": (0.2, 0.1), "allreduce": (0.1, 0), "optimizer": (0.1, 0),
                "publish": (0.2, 0)})


def _run(plan):
    res = simulate(plan, COST)
    assert audit(plan, res.actions, res.events) == []
    return [a for _, a in res.actions if isinstance(a, Generate)], [a for _, a in res.actions if isinstance(a, Train)]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_packed_worker_generates_its_share_at_once_and_trains_chunks_of_the_shape(workers):
    plan = replace(make_plan("colocated", prompts=3, generations=4, fragment_size=2, S=4, T=5, cg=3, cs=2,
                             n_train=workers), packed=True)
    gens, trains = _run(plan)
    share = -(-3 * 2 // workers)  # ceil(P x fragments per group / N)
    assert plan.colocated_share == share
    per_step = [[a for a in gens if a.fragment.step == k] for k in range(plan.steps)]
    assert all(len(g) == workers for g in per_step)  # one action per worker per step
    for g in per_step:  # the actions' parts cover the step's groups once, in dispatch order
        covered = [(p.group, i) for a in g for p in a.fragments for i in p.generations]
        assert sorted(covered) == [(k, i) for k in range(3) for i in range(4)]
    want = sorted(len(c) for grp in range(3) for r in range(workers)
                  for c in tile_grid(classic_shard(plan, grp, r), 4, 3, 2) if classic_shard(plan, grp, r))
    assert sorted(a.chunk.size for a in trains if a.chunk.step == 0) == want


def test_the_unpacked_baseline_is_unchanged():
    plan = make_plan("colocated", prompts=3, generations=4, fragment_size=2, S=4, T=5, cg=3, cs=2, n_train=1)
    gens, trains = _run(plan)
    assert all(not a.more and a.size().generations == 2 for a in gens)  # one plan fragment per action
    assert {a.chunk.size for a in trains} == {4}  # one trained timestep over the worker's 4 generations


def test_packed_is_a_colocated_plan():
    with pytest.raises(PlanError, match="packed"):
        replace(make_plan("naive"), packed=True)
