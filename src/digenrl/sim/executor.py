"""Discrete-event executor of the scheduler in virtual time.

Each action starts when the scheduler emits it (at the time of the event being handled) and lasts
``Durations.of(action) x jitter`` where jitter is 1 or a seeded log-normal factor exp(N(0, sigma^2)). Its end
becomes the corresponding event. Spans record who did what when; gaps are filled with ``idle`` spans.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field

from ..observe.trace import Span
from ..schedule import (Action, ChunkTrained, Commit, Committed, CostModel, Durations, FragmentGenerated,
                        Generate, Publish, Published, Scheduler, StepPlan, StepStats, Train, TRAINER)
from ..schedule.bts import BTSConfig
from ..schedule.cost import Op


class SimulationError(RuntimeError):
    pass


@dataclass
class SimResult:
    plan: StepPlan
    spans: list[Span]
    makespan: float
    stats: list[StepStats]
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

    def _idle(self, workers) -> float:
        if not workers or self.makespan <= 0:
            return 0.0
        ws = set(workers)
        busy = sum(s.duration for s in self.spans if s.worker in ws and s.kind != "idle")
        return max(0.0, 1.0 - busy / (len(ws) * self.makespan))

    @property
    def gen_idle(self) -> float:
        """Idle share of the generator pool (colocated: of all workers)."""
        return self._idle(self.plan.generators or self.plan.trainers)

    @property
    def trainer_idle(self) -> float:
        return self._idle(self.plan.trainers)

    @property
    def tag_fragments_per_step(self) -> float:
        return sum(s.tag_fragments for s in self.stats) / max(1, len(self.stats))

    @property
    def stale_fraction(self) -> float:
        total = sum(s.generations for s in self.stats)
        return sum(s.stale_generations for s in self.stats) / total if total else 0.0


def simulate(plan: StepPlan, cost: CostModel, *, jitter: float = 0.0, seed: int = 0,
             bts: BTSConfig | None = None, record: bool = True, max_events: int = 10_000_000) -> SimResult:
    """Run ``plan`` to completion in virtual time. ``record`` keeps the (start, action) log and the events."""
    if jitter < 0:
        raise ValueError(f"jitter: must be >= 0 (got {jitter})")
    dur = Durations(plan, cost)
    sched = Scheduler(plan, cost=cost, bts_config=bts)
    rng = random.Random(seed)
    pool = {w: "generator" for w in plan.generators}
    pool.update({r: ("colocated" if not plan.mode.disaggregated else "trainer") for r in plan.trainers})
    spans: list[Span] = []
    heap: list = []
    seq = 0
    log: list[tuple[float, Action]] = []
    events: list = []

    def factor() -> float:
        return math.exp(rng.gauss(0.0, jitter)) if jitter > 0 else 1.0

    def launch(t: float, actions: list[Action]) -> None:
        nonlocal seq
        for a in actions:
            d = dur.of(a) * factor()
            end = t + d
            if record:
                log.append((t, a))
            if isinstance(a, Generate):
                kind = "tag" if a.tag else "generate"
                fr = a.fragment
                label = f"s{fr.step} g{fr.group} x{fr.size} v{a.version}{' stale' if a.stale else ''}"
                start = t
                if a.switch:
                    sw = min(d, cost.time(Op.TAG_SWITCH.value, 1, TRAINER) * (d / max(dur.of(a), 1e-300)))
                    spans.append(Span(a.worker, "switch", t, t + sw, "switch to generation", pool[a.worker]))
                    start = t + sw
                spans.append(Span(a.worker, kind, start, end, label, pool[a.worker]))
                ev = FragmentGenerated(end, fr, a.worker)
            elif isinstance(a, Train):
                c = a.chunk
                spans.append(Span(a.rank, "train", t, end, f"s{c.step} g{c.group} {c.size} cells", pool[a.rank]))
                ev = ChunkTrained(end, c, a.rank)
            elif isinstance(a, Commit):
                spans.extend(Span(r, "commit", t, end, f"commit s{a.step}", pool[r]) for r in a.ranks)
                ev = Committed(end, a.step)
            elif isinstance(a, Publish):
                if end > t:
                    spans.extend(Span(r, "publish", t, end, f"publish v{a.version}", pool[r]) for r in a.ranks)
                ev = Published(end, a.version)
            else:  # pragma: no cover - the scheduler only emits the four kinds
                raise SimulationError(f"unknown action {a!r}")
            heapq.heappush(heap, (end, seq, ev))
            seq += 1

    launch(0.0, sched.start(0.0))
    n = 0
    now = 0.0
    while heap:
        now, _, ev = heapq.heappop(heap)
        if record:
            events.append(ev)
        launch(now, sched.on_event(ev))
        n += 1
        if n > max_events:
            raise SimulationError(f"more than {max_events} events: the schedule does not terminate")
    if not sched.done:
        raise SimulationError(f"deadlock: no work in flight at t={now} but the run is not done "
                              f"(train step {sched.train_step}, published {sched.published})")
    spans.extend(_idle_spans(spans, list(plan.generators) + list(plan.trainers), now, pool))
    bts_summary = sched.bts_stats.summary() if sched.bts_stats else None
    bts_times = list(sched.bts_stats.search_s) if sched.bts_stats else []
    return SimResult(plan, spans, now, sched.stats, bts_summary, log, events, bts_times)


def _idle_spans(spans: list[Span], workers: list[str], makespan: float, pool: dict[str, str]) -> list[Span]:
    by_worker: dict[str, list[Span]] = {w: [] for w in workers}
    for s in spans:
        by_worker[s.worker].append(s)
    out = []
    for w, ss in by_worker.items():
        t = 0.0
        for s in sorted(ss, key=lambda s: s.start):
            if s.start > t + 1e-12:
                out.append(Span(w, "idle", t, s.start, "", pool[w]))
            t = max(t, s.end)
        if makespan > t + 1e-12:
            out.append(Span(w, "idle", t, makespan, "", pool[w]))
    return out
