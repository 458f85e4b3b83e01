"""The runtime's I2 check (``WorkerExecutor._check_cells``) stops a run whose trainers recorded a wrong cell set.

No Ray: the executor is driven through a real schedule (the simulator's action log) with fake actor handles
whose calls return at once; each call's result is built from the action, as a worker would report it, and is
handed to the executor's own completion path (``_complete``), so the cells reach the check the way they do in
a run. A trainer result that reports one cell twice, misses one or names a foreign prompt must stop the run
before the commit is sent to any trainer.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from digenrl.control.run_plan import RunPlan
from digenrl.runtime.clocks import Clock
from digenrl.runtime.cluster import ActorPools
from digenrl.runtime.errors import WorkerFailure
from digenrl.runtime.executor import WorkerExecutor
from digenrl.runtime.messages import ChunkResult, CommitResult, FragmentInfo
from digenrl.schedule import Commit, Generate, Train
from digenrl.sim.executor import simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "schedule"))
from sched_helpers import LinCost, make_plan  # noqa: E402

COST = LinCost({"denoise": (0.1, 0.05), "train_chunk": (0.2, 0.1), "allreduce": (0.1, 0), "optimizer": (0.1, 0),
                "publish": (0.2, 0)})
_ids = itertools.count()


class _Ref:
    def __init__(self, worker, method, args):
        self.n, self.worker, self.method, self.args = next(_ids), worker, method, args

    def __hash__(self):
        return self.n


class _Method:
    def __init__(self, worker, name, calls):
        self.worker, self.name, self.calls, self.returns = worker, name, calls, 1

    def options(self, num_returns=1, **_):
        m = _Method(self.worker, self.name, self.calls)
        m.returns = num_returns
        return m

    def remote(self, *args):
        self.calls.append((self.worker, self.name, args))
        refs = tuple(_Ref(self.worker, self.name, args) for _ in range(self.returns))
        return refs if self.returns > 1 else refs[0]


class _Actor:
    def __init__(self, worker, calls):
        self.worker, self.calls = worker, calls

    def __getattr__(self, name):
        return _Method(self.worker, name, self.calls)


def _uid(group: int) -> int:
    return 100 + group


def _result(action, worker, corrupt):
    if isinstance(action, Generate):
        f = action.fragment
        return FragmentInfo(f, worker, action.version, _uid(f.group), tuple(0.5 for _ in f.generations))
    if isinstance(action, Train):
        c = action.chunk
        cells = tuple((_uid(c.group), i, j) for i, j in c.cells)
        return ChunkResult(c, worker, corrupt(c, cells), None)
    if isinstance(action, Commit):
        return CommitResult(action.step, worker, action.step + 1, 0.0)
    return None  # publish


def _replay(plan, corrupt=lambda chunk, cells: cells, calls=None):
    """Launch the simulator's actions in order on a ``WorkerExecutor`` with fake actors, completing each call at
    once through the executor's completion path; the calls the actors received are appended to ``calls``."""
    calls = [] if calls is None else calls
    cfg = SimpleNamespace(train=SimpleNamespace(std_mode="group", adv_baseline="group", adv_std_unbiased=False))
    run = RunPlan(cfg=cfg, plan=plan, trained_timesteps=plan.trained_timesteps)
    pools = ActorPools(generators={w: _Actor(w, calls) for w in plan.generators},
                       trainers={w: _Actor(w, calls) for w in plan.trainers})
    clock = Clock()
    clock.use({w: 0.0 for w in plan.generators + plan.trainers})  # (the fake results' stamps are not checked here)
    ex = WorkerExecutor(run, pools, clock)
    for _, a in simulate(plan, COST).actions:
        ex.launch([a])
        pending = {}
        for ref, call in list(ex._calls.items()):
            if call.action is a:
                call.results[ref] = _result(a, call.workers[ref], corrupt)
                pending[id(call)] = call
                del ex._calls[ref]
        for call in list(pending.values()) + ex._ready:
            ex._complete(call, 0.0)
        ex._ready = []
    return calls


def _commits(calls):
    return [c for c in calls if c[1] == "commit"]


@pytest.mark.parametrize("mode,minibatches", [("gap_tsp", 1), ("gap", 2)])
def test_a_correct_run_commits_every_round(mode, minibatches):
    plan = make_plan(mode, prompts=2, minibatches=minibatches, steps=2)
    calls = _replay(plan)
    assert len(_commits(calls)) == plan.steps * plan.rounds * len(plan.trainers)


def _first_chunk(chunk):
    return chunk.step == 1 and chunk.group == 0 and chunk.cells[0] == (0, 0)


CORRUPT = {
    "a cell twice": lambda c, cells: cells + cells[:1] if _first_chunk(c) else cells,
    "a cell missing": lambda c, cells: cells[1:] if _first_chunk(c) else cells,
    "a foreign prompt's cell": lambda c, cells: ((999,) + cells[0][1:],) + cells[1:] if _first_chunk(c) else cells,
    "a cell outside the grid": lambda c, cells: cells[:-1] + ((cells[-1][0], 99, 0),) if _first_chunk(c) else cells,
}


@pytest.mark.parametrize("what", sorted(CORRUPT))
def test_a_wrong_cell_set_stops_the_run_before_its_commit(what):
    plan = make_plan("gap_tsp", prompts=2, steps=2)
    want = plan.prompts * plan.generations * plan.trained_timesteps
    calls: list = []
    with pytest.raises(WorkerFailure, match=r"during the commit check \(I2\)") as e:
        _replay(plan, corrupt=CORRUPT[what], calls=calls)
    assert e.value.step == 2 and e.value.worker == "driver"  # the scheduler's step 1, as a person counts it
    assert str(e.value).startswith("worker driver failed at step 2 during the commit check (I2)")
    assert f"for a grid of {want} in round 0" in e.value.cause
    # step 0 committed on every rank; step 1's commit never reached a trainer
    assert sorted(c[0] for c in _commits(calls)) == sorted(plan.trainers)
    assert all(c[2][0] == 0 for c in _commits(calls))


def test_the_check_counts_the_rounds_groups_only():
    # M = 2: round 1's commit checks group 1's grid alone; a cell of group 0 (round 0) reported again in round 1
    # is a cell outside that grid
    plan = make_plan("gap", prompts=2, minibatches=2, steps=1)

    def again(c, cells):
        return cells + ((_uid(0), 0, 0),) if c.round == 1 and c.cells[0] == (0, 0) else cells

    with pytest.raises(WorkerFailure, match=r"in round 1"):
        _replay(plan, corrupt=again)
