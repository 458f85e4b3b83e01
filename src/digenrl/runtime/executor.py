"""Scheduler actions -> actor calls; finished calls -> scheduler events (wall time since the run start).

The executor moves object refs only: a ``Generate`` leaves its trajectories in the object store (ref kept
per (step, group)) and carries the ref of the published weights when the generator does not hold that
version yet; a ``Train`` hands the trainer the refs of its group's fragments, and the trainer fetches them.
``Commit`` and ``Publish`` are barriers over several calls; their event fires when the last one is done.
Any failed call raises ``WorkerFailure`` naming the worker and the step.

Before a ``Commit`` the executor checks I2 from what the trainers recorded: the union of the step's chunk
cells is exactly the step's grid, each cell once (each rank's transaction already refuses duplicates and
foreign cells; only the driver sees all ranks).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from digenrl.schedule import (Action, ChunkTrained, Commit, Committed, FragmentGenerated, Generate, Publish,
                              Published, Train)

from .cluster import Pools, error_cause
from .errors import WorkerFailure
from .setup import RuntimeSetup


@dataclass
class Call:
    """One action (or a side call: eval / checkpoint) in flight; done when every ref resolved."""

    action: Action | None
    what: str
    step: int | None
    start: float                              # driver time (run-relative) when launched
    workers: dict = field(default_factory=dict)   # ref -> worker id
    results: list = field(default_factory=list)
    end: float = 0.0
    event: object = None


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


class ActionExecutor:
    def __init__(self, setup: RuntimeSetup, pools: Pools, clock: Clock):
        self.setup, self.pools, self.clock = setup, pools, clock
        self.plan = setup.plan
        self._calls: dict = {}                 # ref -> Call
        self._ready: list[Call] = []           # calls complete without any ref (publish to no generator)
        self._frags: dict[tuple[int, int], dict] = {}   # (step, group) -> {fragment: trajectories ref}
        self._cells: dict[int, list] = {}      # step -> recorded cells
        self._uids: dict[int, dict[int, int]] = {}      # step -> group -> prompt uid
        self._rewards: dict[int, list[float]] = {}      # step -> rewards (for std_mode=global)
        self._weights: dict[int, object] = {}          # version -> published state ref (object store)
        self._held = {w: 0 for w in setup.generator_ids}  # version each generator holds (or is sent)

    @property
    def idle(self) -> bool:
        return not self._calls and not self._ready

    # ---- launching -----------------------------------------------------------------------------------
    def launch(self, actions: list[Action], t: float) -> None:
        for a in actions:
            self._launch(a, t)

    def _launch(self, a: Action, t: float) -> None:
        now = self.clock.now()
        if isinstance(a, Generate):
            f = a.fragment
            args = (f, a.version)
            if a.worker in self._held and self._held[a.worker] != a.version:  # a generator, new version
                args += ([self._weights[a.version]] if a.version in self._weights else None,)
                self._held[a.worker] = a.version
            traj, info = self.pools.actor(a.worker).generate.options(num_returns=2).remote(*args)
            self._frags.setdefault((f.step, f.group), {})[f] = traj
            self._track(Call(a, "generate" if not a.tag else "TAG generate", f.step, now), {info: a.worker})
        elif isinstance(a, Train):
            c = a.chunk
            frags = self._frags[(c.step, c.group)]
            refs = [frags[f] for f in sorted(frags)]
            ref = self.pools.trainers[a.rank].train.remote(c, refs, self._global_std(c.step))
            self._track(Call(a, "train", c.step, now), {ref: a.rank})
        elif isinstance(a, Commit):
            self._check_cells(a.step)
            refs = {self.pools.trainers[r].commit.remote(a.step): r for r in a.ranks}
            self._track(Call(a, "commit", a.step, now), refs)
        elif isinstance(a, Publish):
            refs, state = self.pools.publish_refs(a.version)
            if state is not None:
                self._weights = {a.version: state}  # generators need only the newest version
            names = [a.ranks[0]] + list(a.generators)
            self._track(Call(a, f"publish of version {a.version}", a.version - 1, now), dict(zip(refs, names)))
        else:  # pragma: no cover
            raise TypeError(f"unknown action {a!r}")

    def side(self, worker: str, ref, what: str, step: int | None) -> None:
        """Track a call outside the scheduler (eval, checkpoint) so its failure stops the run too."""
        self._track(Call(None, what, step, self.clock.now()), {ref: worker})

    def _track(self, call: Call, refs: dict) -> None:
        call.workers = dict(refs)
        if not refs:
            self._ready.append(call)
        for r in refs:
            self._calls[r] = call

    # ---- completions ---------------------------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> list[Call]:
        """Block until at least one call completed; return the completed calls (events set for actions)."""
        import ray

        done: list[Call] = []
        if not self._ready:
            if not self._calls:
                raise RuntimeError("executor: waiting with nothing in flight (the schedule is stuck)")
            refs = list(self._calls)
            ready, rest = ray.wait(refs, num_returns=1, timeout=timeout)
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
        # calls that finished together are reported collectives first: the scheduler then dispatches with the
        # newest published version (the audit counts a publish ending at t as visible to actions at t)
        self._ready.sort(key=lambda c: not isinstance(c.action, (Commit, Publish)))
        for call in self._ready:
            call.end = now
            call.event = self._event(call, now)
            done.append(call)
        self._ready = []
        return done

    def _event(self, call: Call, now: float):
        a = call.action
        if isinstance(a, Generate):
            info = call.results[0]
            f = a.fragment
            self._uids.setdefault(f.step, {})[f.group] = info.uid
            self._rewards.setdefault(f.step, []).extend(info.rewards)
            return FragmentGenerated(now, f, a.worker)
        if isinstance(a, Train):
            self._cells.setdefault(a.chunk.step, []).extend(call.results[0].cells)
            return ChunkTrained(now, a.chunk, a.rank)
        if isinstance(a, Commit):
            for key in [k for k in self._frags if k[0] <= a.step]:
                del self._frags[key]
            for d in (self._cells, self._uids, self._rewards):
                d.pop(a.step, None)
            return Committed(now, a.step)
        if isinstance(a, Publish):
            return Published(now, a.version)
        return None

    # ---- checks --------------------------------------------------------------------------------------
    def _global_std(self, step: int) -> float | None:
        if self.setup.cfg.train.std_mode != "global":
            return None
        import torch

        r = torch.tensor(self._rewards[step], dtype=torch.float64)
        if len(r) != self.plan.batch:
            raise RuntimeError(f"step {step}: std_mode=global needs all {self.plan.batch} rewards, have {len(r)}")
        return float(r.std(unbiased=False))

    def _check_cells(self, step: int) -> None:
        cells = self._cells.get(step, [])
        uids = self._uids.get(step, {})
        p = self.plan
        want = {(uids.get(g), i, j) for g in range(p.prompts) for i in range(p.generations)
                for j in range(p.trained_timesteps)}
        if len(cells) != len(set(cells)) or set(cells) != want:
            raise WorkerFailure("driver", step, "the commit check (I2)",
                                f"{len(cells)} recorded cells ({len(set(cells))} distinct) for a grid of {len(want)}")
