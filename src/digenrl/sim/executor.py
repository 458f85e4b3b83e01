"""The virtual-time executor: the scheduler's actions priced by a cost model, completions from a heap.

Each action starts when the scheduler emits it (at the time of the event being handled) and lasts
``Durations.of(action) x jitter`` where jitter is 1 or a seeded log-normal factor exp(N(0, sigma^2)), one
independent draw per action. ``sigma`` is one number for every action, or per action kind (``Action.kind``:
``{"generate": s_g, "train": s_t, "commit": s_c, "publish": s_p}``, missing kinds 0), e.g. the per-op
spread measured on a real run (``benchmarks/op_jitter.py``). It holds ``Action.workers`` from its start to its
end, which becomes the corresponding event. The control loop, the tie rule for events that end together, the spans and
the run figures are those of ``digenrl.control`` (the same code the Ray runtime runs).
"""

from __future__ import annotations

import heapq
import math
import random
from types import SimpleNamespace
from typing import Mapping, Sequence

from ..control.loop import Completion, Interval, LoopError, run_loop, tie_order
from ..control.timeline import RunResult, Timeline
from ..schedule import TRAINER, Action, CostModel, Durations, Generate, Scheduler, StepPlan
from ..schedule.actions import KINDS as JITTER_KINDS  # the action kinds
from ..schedule.bts import BTSConfig
from ..schedule.cost import Op


class SimulationError(RuntimeError):
    pass


class VirtualExecutor:
    """``control.loop.Executor`` in virtual time: every action ends after its (jittered) modelled duration."""

    def __init__(self, plan: StepPlan, cost: CostModel, jitter: float | Mapping[str, float] = 0.0, seed: int = 0,
                 max_actions: int = 10_000_000):
        per_kind = dict(jitter) if isinstance(jitter, Mapping) else None
        for k, v in (per_kind.items() if per_kind is not None else [("jitter", jitter)]):
            if per_kind is not None and k not in JITTER_KINDS:
                raise ValueError(f"jitter: unknown action kind {k!r} (one of {', '.join(JITTER_KINDS)})")
            if not v >= 0:
                raise ValueError(f"jitter: must be >= 0 (got {k}={v})")
        self.plan, self.cost = plan, cost
        self.jitter = 0.0 if per_kind is not None else float(jitter)
        self.per_kind = per_kind
        self.dur = Durations(plan, cost)
        self.rng = random.Random(seed)
        self.max_actions = max_actions
        self._heap: list = []
        self._seq = 0
        self.now = 0.0   # virtual time of the last completion handed out

    @property
    def idle(self) -> bool:
        return not self._heap

    def _factor(self, kind: str) -> float:
        if self.per_kind is not None:  # one draw per action, whatever its kind's sigma
            return math.exp(self.rng.gauss(0.0, self.per_kind.get(kind, 0.0)))
        return math.exp(self.rng.gauss(0.0, self.jitter)) if self.jitter > 0 else 1.0

    def launch(self, actions: Sequence[Action]) -> None:
        t, of, heap = self.now, self.dur.of, self._heap
        exact_only = self.per_kind is None and not self.jitter > 0  # factor 1, no draw: d = exact x 1.0 = exact
        for a in actions:
            exact = of(a)
            d = exact if exact_only else exact * self._factor(a.kind)
            switch = 0.0
            if isinstance(a, Generate) and a.switch:  # the switch's share of the (jittered) duration
                switch = min(d, self.cost.time(Op.TAG_SWITCH.value, 1, TRAINER) * (d / max(exact, 1e-300)))
            end = t + d
            c = Completion(a, t, end, tuple([Interval(w, t, end) for w in a.workers]), switch)
            heapq.heappush(heap, (end, self._seq, c))
            self._seq += 1
            if self._seq > self.max_actions:
                raise SimulationError(f"more than {self.max_actions} actions: the schedule does not terminate")

    def wait(self) -> list[Completion]:
        heap = self._heap
        end, _, c = heapq.heappop(heap)
        self.now = end
        if not heap or heap[0][0] != end:
            return [c]  # (``tie_order`` of one completion)
        done = [c]
        while heap and heap[0][0] == end:
            done.append(heapq.heappop(heap)[2])
        return tie_order(done)


def simulate(plan: StepPlan, cost: CostModel, *, jitter: float | Mapping[str, float] = 0.0, seed: int = 0,
             bts: BTSConfig | None = None, record: bool = True, profile: CostModel | None = None) -> RunResult:
    """Run ``plan`` to completion in virtual time. ``record`` keeps the (start, action) log and the events.
    ``bts``: the TAG decision policy and BTS options (``BTSConfig``; ``policy`` bts, greedy or none).
    ``profile``: the cost model the scheduler and BTS plan with, where it differs from ``cost``, the one the
    actions take (a run on a machine its profile misjudges; ``BTSConfig.online`` then refines it)."""
    ex = VirtualExecutor(plan, cost, jitter, seed)
    sched = Scheduler(plan, cost=cost if profile is None else profile, bts_config=bts)
    timeline = Timeline(plan)
    try:
        end = run_loop(sched, ex, timeline)
    except LoopError as e:
        raise SimulationError(str(e)) from None
    res = timeline.result(sched, end)
    if not record:
        res.actions, res.events = [], []
    return res


# the control loop's timeline hooks, keeping nothing (``steady_step_time``)
_UNTIMED = SimpleNamespace(launched=lambda actions, t: actions, record=lambda c: None)


class _Above(Exception):
    pass


class _CappedExecutor(VirtualExecutor):
    """``VirtualExecutor`` that stops the run once the time since the first publish proves the steady step time
    above ``cap`` seconds: events come in time order and the last publish is the last event, so at an event at
    t, t_pub(K) - t_pub(1) >= t - t_pub(1)."""

    def __init__(self, plan, cost, stats, cap):
        super().__init__(plan, cost)
        self.stats, self.limit = stats, cap * (plan.steps - 1) * (1.0 + 1e-9)  # margin: float rounding

    def wait(self):
        done = super().wait()
        first = self.stats[0].published
        if first is not None and self.now - first > self.limit:
            raise _Above
        return done


def steady_step_time(plan: StepPlan, cost: CostModel, *, bts: BTSConfig | None = None,
                     above: float = float("inf")) -> float | None:
    """``simulate(plan, cost, bts=bts, record=False).timing()["steady_step_time_s"]``, the same run and the same
    float, (t_pub(K) - t_pub(1)) / (K - 1) from the scheduler's step statistics, without building spans, the
    log or the other run figures (the planner's probes). Needs K = ``plan.steps`` >= 3. ``above``: None as soon
    as the run shows its figure is strictly above it (the rest is not simulated)."""
    if plan.steps < 3:
        raise ValueError(f"steps: a steady step time needs at least 3 steps (got {plan.steps})")
    sched = Scheduler(plan, cost=cost, bts_config=bts)
    ex = VirtualExecutor(plan, cost) if above == float("inf") else _CappedExecutor(plan, cost, sched.stats, above)
    try:
        run_loop(sched, ex, _UNTIMED)
    except LoopError as e:
        raise SimulationError(str(e)) from None
    except _Above:
        return None
    pubs = [s.published for s in sched.stats]
    return (pubs[-1] - pubs[0]) / (plan.steps - 1)


class _EndCapped(VirtualExecutor):
    """``VirtualExecutor`` that stops the run once its time proves makespan / K above ``cap`` seconds: events come in
    time order, and while the scheduler is not done an event at t or a later one is still handled, so the makespan
    (the last handled event) is at least t."""

    def __init__(self, plan, cost, sched, cap):
        super().__init__(plan, cost)
        self.sched, self.limit = sched, cap * plan.steps * (1.0 + 1e-9)  # margin: float rounding

    def wait(self):
        draining = self.sched.done
        done = super().wait()
        if not draining and self.now > self.limit:
            raise _Above
        return done


def run_step_time(plan: StepPlan, cost: CostModel, *, bts: BTSConfig | None = None,
                  above: float = float("inf")) -> float | None:
    """``simulate(plan, cost, bts=bts, record=False).step_time``, the same run and the same float: makespan / K
    (K = ``plan.steps``, the first step's pipeline fill and the last step included), without building spans (the
    planner's pick at a run's length). ``above``: None as soon as the run shows its figure is strictly above it."""
    sched = Scheduler(plan, cost=cost, bts_config=bts)
    ex = VirtualExecutor(plan, cost) if above == float("inf") else _EndCapped(plan, cost, sched, above)
    try:
        end = run_loop(sched, ex, _UNTIMED)
    except LoopError as e:
        raise SimulationError(str(e)) from None
    except _Above:
        return None
    return end / plan.steps if plan.steps else 0.0


__all__ = ["JITTER_KINDS", "SimulationError", "VirtualExecutor", "run_step_time", "simulate", "steady_step_time"]
