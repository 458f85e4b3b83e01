"""What a run did, when: spans per worker, the action/event log, and the run-level figures of both executors.

``Timeline`` records every ``Completion`` of the control loop as spans (the action's ``span_kind``, ``label()``
and ``size()``) and logs what the scheduler emitted; ``Timeline.result`` closes the run into a
``RunResult``: spans with the idle gaps filled, makespan, the scheduler's step statistics, BTS statistics, and
the figures reported by ``digenrl simulate`` and a runtime run's summary (step time, idle share per pool, TAG
fragments per step, stale share, steady-state step time and efficiency), plus the Chrome trace and the Gantt
chart. The simulator and the runtime produce all of these through this one module.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from digenrl.observe.trace import Span
from digenrl.schedule import Action, Scheduler, StepPlan, StepStats
from digenrl.schedule.layout import busy_share

from .loop import Completion


def pools_of(plan: StepPlan) -> dict[str, tuple[str, ...]]:
    """pool name -> its workers (one pool, "colocated", in colocated mode)."""
    if not plan.mode.disaggregated:
        return {"colocated": plan.trainers}
    return {"generator": plan.generators, "trainer": plan.trainers}


def rank_busy(plan: StepPlan):
    """Span -> the share of its worker's ranks at work: 1, except on a shard group of N ranks
    (``plan.shard_ranks``), where a chunk of c cells or a fragment of n generations keeps
    ``layout.busy_share(c, N)`` of the ranks busy and the others wait inside the collective."""
    n = plan.shard_ranks
    trainers = set(plan.trainers)

    def weight(s: Span) -> float:
        if n <= 1 or s.worker not in trainers or s.kind not in ("train", "tag", "generate"):
            return 1.0
        return busy_share(s.size.units, n)

    return weight


def idle_share(spans: list[Span], workers, t0: float, t1: float, weight=None) -> float:
    """1 - (busy seconds of ``workers`` inside [t0, t1]) / (len(workers) * (t1 - t0)); ``weight(span)``: the
    share of the worker's ranks a span keeps busy (``rank_busy``; default 1)."""
    ws = set(workers)
    if t1 <= t0 or not ws:
        return 0.0
    busy = sum(max(0.0, min(s.end, t1) - max(s.start, t0)) * (1.0 if weight is None else weight(s))
               for s in spans if s.worker in ws and s.kind != "idle")
    return max(0.0, 1.0 - busy / (len(ws) * (t1 - t0)))


def with_idle(spans: list[Span], workers, end: float, pool: dict[str, str]) -> list[Span]:
    """``spans`` plus ``idle`` spans filling every worker's gaps up to ``end``."""
    out = list(spans)
    for w in workers:
        t = 0.0
        for s in sorted((s for s in spans if s.worker == w), key=lambda s: s.start):
            if s.start > t + 1e-9:
                out.append(Span(w, "idle", t, s.start, "", pool.get(w, "workers")))
            t = max(t, s.end)
        if end > t + 1e-9:
            out.append(Span(w, "idle", t, end, "", pool.get(w, "workers")))
    return out


class Timeline:
    """Spans and the action/event log of one run, fed by the control loop."""

    def __init__(self, plan: StepPlan):
        self.plan = plan
        self.pool = {w: pool for pool, workers in pools_of(plan).items() for w in workers}  # worker id -> pool
        self.spans: list[Span] = []
        self.log: list[tuple[float, Action]] = []   # (start time, action): what the scheduler emitted
        self.events: list = []                      # what was reported back

    def launched(self, actions: list[Action], t: float) -> list[Action]:
        self.log.extend((t, a) for a in actions)
        return actions

    def span(self, worker: str, kind: str, start: float, end: float, label: str = "", size=None) -> None:
        self.spans.append(Span(worker, kind, start, max(start, end), label, self.pool.get(worker, "workers"), size))

    def record(self, c: Completion) -> None:
        if c.action is None:  # a side call (eval / checkpoint between steps; c.step: the steps done, so the
            # number of the step it follows, as the actions' labels number steps: schedule.step_number)
            for w in c.work:
                self.span(w.worker, c.side or "side", w.start, w.end, f"{c.side} after s{c.step}")
            return
        self.events.append(c.event)
        a = c.action
        kind, label, size = a.span_kind, a.label(), a.size()
        for w in c.work:
            start = w.start
            if c.switch_s > 0:
                start = min(w.end, w.start + c.switch_s)
                self.span(w.worker, "switch", w.start, start, "switch to generation")
            if kind != "publish" or w.end > w.start:
                self.span(w.worker, kind, start, w.end, label, size)

    def result(self, sched: Scheduler, makespan: float) -> "RunResult":
        p = self.plan
        workers = list(p.generators) + list(p.trainers)
        bts = sched.bts_stats
        return RunResult(p, with_idle(self.spans, workers, makespan, self.pool), makespan, sched.stats,
                         bts.summary() if bts else None, self.log, self.events, list(bts.search_s) if bts else [])


@dataclass
class RunResult:
    """One run of a plan (simulated or real): what happened and the figures both executors report."""

    plan: StepPlan
    spans: list[Span]                 # every worker's spans, idle gaps filled up to the makespan
    makespan: float
    stats: list[StepStats]            # the scheduler's per-step statistics (event times)
    bts: dict | None
    actions: list[tuple[float, Action]] = field(default_factory=list)  # (start time, action), in order
    events: list = field(default_factory=list)
    bts_times: list[float] = field(default_factory=list)  # seconds per BTS decision

    @property
    def workers(self) -> list[str]:
        return list(self.plan.generators) + list(self.plan.trainers)

    @property
    def step_time(self) -> float:
        """Makespan / K (includes the first step's pipeline fill)."""
        return self.makespan / self.plan.steps if self.plan.steps else 0.0

    def idle(self, pool: str) -> float:
        """Idle share of ``pool`` ("generator", "trainer", "colocated") over the whole run."""
        return idle_share(self.spans, pools_of(self.plan).get(pool, ()), 0.0, self.makespan, rank_busy(self.plan))

    @property
    def gen_idle(self) -> float:
        """Idle share of the generator pool (colocated: of all workers)."""
        return self.idle("generator" if self.plan.mode.disaggregated else "colocated")

    @property
    def trainer_idle(self) -> float:
        return self.idle("trainer" if self.plan.mode.disaggregated else "colocated")

    @property
    def tag_fragments_per_step(self) -> float:
        return sum(s.tag_fragments for s in self.stats) / max(1, len(self.stats))

    @property
    def stale_fraction(self) -> float:
        total = sum(s.generations for s in self.stats)
        return sum(s.stale_generations for s in self.stats) / total if total else 0.0

    def timing(self) -> dict:
        """Step time, efficiency (busy time / workers / time), idle share per pool, over the run and in steady
        state (from the first publish to the last: no pipeline fill), TAG fragments per step, stale share."""
        p, spans, w = self.plan, self.spans, rank_busy(self.plan)
        out = {"step_time_s": self.step_time,
               "efficiency": 1.0 - idle_share(spans, self.workers, 0.0, self.makespan, w)}
        for pool, ws in pools_of(p).items():
            out[f"idle/{pool}"] = idle_share(spans, ws, 0.0, self.makespan, w)
        pubs = [s.published for s in self.stats]
        if p.steps >= 3 and all(t is not None for t in pubs):
            out["steady_step_time_s"] = (pubs[-1] - pubs[0]) / (p.steps - 1)
            out["steady_efficiency"] = 1.0 - idle_share(spans, self.workers, pubs[0], pubs[-1], w)
        out["tag_fragments_per_step"] = self.tag_fragments_per_step
        out["stale_fraction"] = self.stale_fraction
        return out

    def write_trace(self, path: str | Path) -> Path:
        """Chrome trace JSON (open in Perfetto) of the whole run."""
        from digenrl.observe.trace import write_chrome_trace

        return write_chrome_trace(self.spans, path, self.workers)

    def write_gantt(self, path: str | Path, title: str, steps: int | None = None) -> Path:
        """Gantt PNG, one row per worker; ``steps``: only the first that many steps."""
        from digenrl.observe.gantt import plot_gantt

        spans = self.spans
        if steps is not None and self.stats:
            k = min(steps, len(self.stats)) - 1
            end = self.stats[k].published or self.makespan
            spans = [replace(s, end=min(s.end, end)) for s in spans if s.start < end]
            title = f"{title} (first {k + 1} steps)"
        return plot_gantt(spans, path, title, self.workers)

    def pools_label(self) -> str:
        ng, nt = len(self.plan.generators), len(self.plan.trainers)
        if ng:
            return f"{ng} generator{'s' * (ng != 1)} + {nt} trainer rank{'s' * (nt != 1)}"
        return f"{nt} colocated worker{'s' * (nt != 1)}"
