"""The one control loop of a run: the scheduler's actions go to an executor, its completions come back as events.

Two executors implement ``Executor``: ``sim.executor.VirtualExecutor`` (completion times from a cost model, in
virtual time) and ``runtime.executor.WorkerExecutor`` (calls on real workers, in wall time). The loop turns each
``Completion`` into the scheduler's event (``Action.event``), feeds it to the scheduler, launches what the
scheduler returns at the event's time, and lets ``Timeline`` record spans and the action/event log.

Tie rule (both executors): completions that end at the same time are reported together, collectives first
(``Commit``, ``Publish``), then in launch order. So the scheduler dispatches with the newest published version,
and the audit counts a publish that ends at t as visible to actions launched at t."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, Sequence

from digenrl.schedule import Action, Event, Scheduler


SideCall = Literal["eval", "checkpoint"]  # work a runtime does between steps, outside the schedule


class LoopError(RuntimeError):
    """The schedule cannot go on (nothing in flight but the run is not done)."""


@dataclass(frozen=True)
class Interval:
    """``worker`` was busy with the completed work from ``start`` to ``end`` (executor seconds)."""

    worker: str
    start: float
    end: float


@dataclass
class Completion:
    """A finished action, or a side call of the runtime (``side`` = "eval" / "checkpoint", ``action`` None).

    ``start``: when it was launched; ``end``: when the executor saw it finish (the event's time); ``work``:
    who was busy when (the simulator: [start, end] per worker; the runtime: the workers' own timestamps);
    ``switch_s``: seconds of a TAG switch at the start of a Generate; ``results``: the executor's payloads
    (worker results in the runtime) for its own bookkeeping; ``step``: the step a side call follows.
    """

    action: Action | None
    start: float
    end: float
    work: tuple[Interval, ...] = ()
    switch_s: float = 0.0
    side: SideCall | None = None
    step: int | None = None
    results: list = field(default_factory=list)

    @property
    def event(self) -> Event | None:
        return None if self.action is None else self.action.event(self.end)


def tie_order(completions: list[Completion]) -> list[Completion]:
    """Completions that end together: collectives first, else the given (launch) order (a stable sort)."""
    return sorted(completions, key=lambda c: not (c.action is not None and c.action.collective))


class Executor(Protocol):
    """What the loop needs of an executor."""

    def launch(self, actions: Sequence[Action]) -> None:
        """Start ``actions`` now: at the time of the last completion ``wait`` returned (0 before the first)."""

    def wait(self) -> list[Completion]:
        """Block until work finished; every completion that ended at that time, in ``tie_order``."""

    @property
    def idle(self) -> bool:
        """Nothing in flight."""


class Observer(Protocol):
    """Optional hooks of the runtime (metrics, evals and checkpoints between steps)."""

    def on_completion(self, c: Completion) -> None: ...

    def after_wait(self) -> None: ...


def run_loop(sched: Scheduler, executor: Executor, timeline, observer: Observer | None = None,
             t0: float = 0.0) -> float:
    """Run ``sched`` to the end on ``executor``, starting at executor time ``t0``; returns the time of the last
    event (the makespan). Side calls the observer started (evals, checkpoints) are drained after the last event.
    """
    launch, wait, launched, record = executor.launch, executor.wait, timeline.launched, timeline.record
    launch(launched(sched.start(t0), t0))
    end = t0
    while not (sched.done and executor.idle):          # once done: drain the evals / checkpoints in flight
        if executor.idle:
            raise LoopError(f"deadlock: no work in flight at t={end} but the run is not done "
                            f"(train step {sched.train_step}, published {sched.published})")
        draining = sched.done
        for c in wait():                               # completions -> events -> actions
            record(c)
            if observer is not None:                   # (side calls it starts go before the next actions)
                observer.on_completion(c)
            ev = c.event
            if ev is not None and not draining:
                end = ev.time
                launch(launched(sched.on_event(ev), end))
        if observer is not None:
            observer.after_wait()
    return end
