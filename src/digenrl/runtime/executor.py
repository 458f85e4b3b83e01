"""The Ray executor: scheduler actions -> actor calls; finished calls -> ``Completion`` records (wall time).

``RayExecutor`` implements ``digenrl.control.loop.Executor``. It moves object refs only: a ``Generate`` leaves
its trajectories in the object store (ref kept per (step, group)) and carries the ref of the published weights
when the generator does not hold that version yet; a ``Train`` hands the trainer the refs of its group's
fragments, and the trainer fetches them. ``Commit`` and ``Publish`` are barriers over several calls; they
complete when the last one is done. Calls that complete together are reported in the control loop's tie
order. Any failed call raises ``WorkerFailure`` naming the worker and the step, and so does a call that has
not answered within its watchdog budget (``budget(action)`` seconds; a stalled worker).

Before a ``Commit`` the executor checks I2 from what the trainers recorded: the union of the round's chunk
cells is exactly the grid of the round's groups, each cell once (each rank's transaction already refuses
duplicates and foreign cells; only the driver sees all ranks). It also passes the commit the rest of the loss
scale, 1 / (trajectories of the round's groups that count in the mean), from what the trainers reported.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from digenrl.control.loop import Completion, Interval, SideCall, tie_order
from digenrl.control.run_plan import RunPlan
from digenrl.schedule import Action, Commit, Generate, Publish, Train
from digenrl.schedule.layout import grid_cells

from .cluster import ActorPools, error_cause
from .errors import WorkerFailure


def describe(action: Action) -> str:
    """What a failed action was doing, for ``WorkerFailure``."""
    if isinstance(action, Generate):
        return "TAG generate" if action.tag else "generate"
    if isinstance(action, Train):
        return "train"
    if isinstance(action, Commit):
        return "commit"
    return f"publish of version {action.version}"


@dataclass
class _Call:
    """One action (or side call) in flight; done when every ref resolved."""

    action: Action | None
    side: SideCall | None
    step: int | None
    start: float                              # driver time (run-relative) when launched
    workers: dict = field(default_factory=dict)   # ref -> worker id
    results: list = field(default_factory=list)
    deadline: float | None = None             # driver time by which it must have answered (watchdog)

    @property
    def what(self) -> str:
        return describe(self.action) if self.action is not None else str(self.side)


@dataclass
class _StepRefs:
    """What the executor keeps about one step until its commit."""

    fragments: dict = field(default_factory=dict)   # group -> {fragment: trajectories ref}
    cells: list = field(default_factory=list)       # cells the trainers recorded in the current round
    uids: dict = field(default_factory=dict)        # group -> prompt uid
    kept: dict = field(default_factory=dict)        # group -> trajectories that count in the loss mean
    rewards: list = field(default_factory=list)     # every reward of the step (step-wide advantage statistics)


class Clock:
    """Run-relative seconds: ``now()`` from the driver's monotonic clock; ``rel(wall)`` for worker stamps."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.t0, self.wall0 = time.perf_counter(), time.time()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def rel(self, wall: float) -> float:
        return wall - self.wall0


class RayExecutor:
    """``version``: the weights every worker holds at the start (the first step of a resumed or recovered run);
    ``budget``: the watchdog's seconds for an action, or None for no deadline (side calls: ``budget(None)``)."""

    def __init__(self, run: RunPlan, pools: ActorPools, clock: Clock, version: int = 0,
                 budget: Callable[[Action | None], float | None] = lambda a: None):
        self.run, self.pools, self.clock, self.budget = run, pools, clock, budget
        self.plan = run.plan
        self._calls: dict = {}                 # ref -> _Call
        self._ready: list[_Call] = []          # calls complete without any ref (publish to no generator)
        self._steps: dict[int, _StepRefs] = {}
        self._weights: dict[int, object] = {}          # version -> published state ref (object store)
        self._held = {w: version for w in run.generator_ids}  # version each generator holds (or is sent)

    @property
    def idle(self) -> bool:
        return not self._calls and not self._ready

    def _step(self, k: int) -> _StepRefs:
        return self._steps.setdefault(k, _StepRefs())

    # ---- launching -----------------------------------------------------------------------------------
    def launch(self, actions: Sequence[Action]) -> None:
        for a in actions:
            self._launch(a)

    def _launch(self, a: Action) -> None:
        now = self.clock.now()
        if isinstance(a, Generate):
            f = a.fragment
            args = (f, a.version)
            if a.worker in self._held and self._held[a.worker] != a.version:  # a generator, new version
                args += ([self._weights[a.version]] if a.version in self._weights else None,)
                self._held[a.worker] = a.version
            traj, info = self.pools.actor(a.worker).generate.options(num_returns=2).remote(*args)
            self._step(f.step).fragments.setdefault(f.group, {})[f] = traj
            self._track(_Call(a, None, f.step, now), {info: a.worker})
        elif isinstance(a, Train):
            c = a.chunk
            frags = self._step(c.step).fragments[c.group]
            refs = [frags[f] for f in sorted(frags)]
            ref = self.pools.trainers[a.rank].train.remote(c, refs, self._step_stats(c.step))
            self._track(_Call(a, None, c.step, now), {ref: a.rank})
        elif isinstance(a, Commit):
            self._check_cells(a.step, a.round)
            st = self._step(a.step)
            kept = sum(st.kept.get(g, 0) for g in self.plan.round_groups(a.round))
            refs = {self.pools.trainers[r].commit.remote(a.step, a.round, a.final, 1.0 / max(kept, 1)): r
                    for r in a.ranks}
            self._track(_Call(a, None, a.step, now), refs)
        elif isinstance(a, Publish):
            refs, state = self.pools.publish_refs(a.version)
            if state is not None:
                self._weights = {a.version: state}  # generators need only the newest version
            names = [a.ranks[0]] + list(a.generators)
            self._track(_Call(a, None, a.version - 1, now), dict(zip(refs, names)))
        else:  # pragma: no cover
            raise TypeError(f"unknown action {a!r}")

    def side(self, worker: str, ref, kind: SideCall, step: int | None) -> None:
        """Track a call outside the scheduler (``kind`` "eval" / "checkpoint") so its failure stops the run."""
        self._track(_Call(None, kind, step, self.clock.now()), {ref: worker})

    def _track(self, call: _Call, refs: dict) -> None:
        call.workers = dict(refs)
        b = self.budget(call.action)
        call.deadline = None if b is None else call.start + b
        if not refs:
            self._ready.append(call)
        for r in refs:
            self._calls[r] = call

    # ---- completions ---------------------------------------------------------------------------------
    def wait(self) -> list[Completion]:
        """Block until at least one call completed; every call complete now, in the loop's tie order."""
        import ray

        if not self._ready:
            if not self._calls:
                raise RuntimeError("executor: waiting with nothing in flight (the schedule is stuck)")
            refs = list(self._calls)
            due = min((c.deadline for c in self._calls.values() if c.deadline is not None), default=None)
            timeout = None if due is None else max(0.0, due - self.clock.now())
            ready, rest = ray.wait(refs, num_returns=1, timeout=timeout)
            if not ready and due is not None and self.clock.now() >= due:
                self._stalled()
            if rest and ready:
                ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
            for ref in ready:
                call = self._calls.pop(ref)
                try:
                    call.results.append(ray.get(ref))
                except Exception as e:  # the worker raised, or its process died
                    raise WorkerFailure(call.workers[ref], call.step, call.what, error_cause(e)) from e
                if not any(c is call for c in self._calls.values()):
                    self._ready.append(call)
        now = self.clock.now()
        done = [self._complete(call, now) for call in self._ready]
        self._ready = []
        return tie_order(done)

    def _stalled(self) -> None:
        now = self.clock.now()
        for ref, call in self._calls.items():
            if call.deadline is not None and now >= call.deadline:
                raise WorkerFailure(call.workers[ref], call.step, call.what,
                                    f"no answer within {call.deadline - call.start:.0f} s (runtime.watchdog_s): "
                                    f"the worker is stalled")

    def _complete(self, call: _Call, now: float) -> Completion:
        a, rel = call.action, self.clock.rel
        if a is None or not isinstance(a, Publish):
            work = tuple(Interval(r.worker, rel(r.start), rel(r.end)) for r in call.results)
        else:  # rank 0 is busy until every generator has the version
            work = tuple(Interval(r, call.start, now) for r in a.ranks) if a.generators else ()
        if isinstance(a, Generate):
            info = call.results[0]
            st = self._step(a.fragment.step)
            st.uids[a.fragment.group] = info.uid
            st.rewards.extend(info.rewards)
        elif isinstance(a, Train):
            st, res = self._step(a.chunk.step), call.results[0]
            st.cells.extend(res.cells)
            st.kept[a.chunk.group] = res.kept
        elif isinstance(a, Commit):
            if a.final:
                for k in [k for k in self._steps if k <= a.step]:
                    del self._steps[k]
            else:
                self._step(a.step).cells = []
        return Completion(a, call.start, now, work, side=call.side, step=call.step, results=call.results)

    # ---- checks --------------------------------------------------------------------------------------
    def _step_stats(self, step: int) -> dict | None:
        """Step-wide reward statistics for the advantages of the barrier modes (``std_mode=global``,
        ``adv_baseline=batch``), computed as ``algo.advantage.group_advantages`` computes them over a batch."""
        t = self.run.cfg.train
        if t.std_mode != "global" and t.adv_baseline != "batch":
            return None
        import torch

        r = torch.tensor(self._step(step).rewards, dtype=torch.float64)
        if len(r) != self.plan.batch:
            raise RuntimeError(f"step {step}: step-wide advantages need all {self.plan.batch} rewards, have {len(r)}")
        return {"global_std": float(r.std(unbiased=t.adv_std_unbiased)), "global_mean": float(r.mean())}

    def _check_cells(self, step: int, round: int) -> None:
        st = self._step(step)
        p = self.plan
        want = grid_cells([st.uids.get(g) for g in p.round_groups(round)], p.generations, p.trained_timesteps)
        if len(st.cells) != len(set(st.cells)) or set(st.cells) != want:
            raise WorkerFailure("driver", step, "the commit check (I2)",
                                f"{len(st.cells)} recorded cells ({len(set(st.cells))} distinct) for a grid of "
                                f"{len(want)} in round {round}")
