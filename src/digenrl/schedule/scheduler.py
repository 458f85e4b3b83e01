"""The scheduler: a pure state machine from events to actions (see the package docstring for the API)."""

from __future__ import annotations

import time
from collections import deque
from typing import Callable

from .actions import Action, ChunkTrained, Commit, Committed, Event, FragmentGenerated, Generate, Publish
from .actions import Published, Train
from .bts import BTS, BTSConfig, BTSStats
from .bts_model import Snapshot, tag_targets
from .cost import CostModel, Durations
from .layout import Chunk, Fragment, classic_chunks, step_fragments, tsp_chunks
from .plan import Mode, StepPlan
from .stats import StepStats


class SchedulerError(RuntimeError):
    """An event that does not match the scheduler's state (wrong worker, unknown work, time going back)."""


class Scheduler:
    """Drives one run of ``plan``. ``cost`` is required in TAG modes (BTS predicts with it)."""

    def __init__(self, plan: StepPlan, cost: CostModel | None = None, bts_config: BTSConfig | None = None,
                 bts_clock: Callable[[], float] = time.perf_counter):
        if plan.mode.tag and cost is None:
            raise ValueError(f"cost: mode {plan.mode.value!r} needs a cost model (BTS predicts with it)")
        self.plan = plan
        self._dur = Durations(plan, cost) if cost is not None else None
        self.bts: BTS | None = BTS(plan, cost, bts_config, bts_clock) if plan.mode.tag else None
        self.stats = [StepStats(k, generations=plan.batch) for k in range(plan.steps)]
        self.train_step = 0          # the step whose chunks the trainers work on (= committed steps)
        self.published = 0           # the newest version the generators hold
        self._now = float("-inf")
        self._started = False
        self._pending: dict[int, deque[Fragment]] = {}
        self._outstanding: dict[tuple[int, int], int] = {}
        self._groups_left: dict[int, int] = {}
        self._held: dict[int, list[int]] = {}
        self._ready: deque[Chunk] = deque()
        self._rank_ready = {r: deque() for r in plan.trainers}
        self._chunks_left: dict[int, int] = {}
        self._version: dict[Fragment, int] = {}
        self._stale: dict[int, list[Fragment]] = {}
        self._stale_gens: dict[int, int] = {}
        self._busy: dict[str, tuple[Action, float] | None] = {w: None for w in plan.generators + plan.trainers}
        self._last_gen = {r: False for r in plan.trainers}
        self._tag_queue = {r: deque() for r in plan.trainers}
        self._collective: str | None = None  # "commit" / "publish" while the trainer ranks are in one
        self._rank_index = {r: i for i, r in enumerate(plan.trainers)}

    # ---- public API --------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._started and self.published >= self.plan.steps

    @property
    def bts_stats(self) -> BTSStats | None:
        return self.bts.stats if self.bts else None

    def version_of(self, fragment: Fragment) -> int:
        """The policy version the fragment was (or is being) generated with."""
        return self._version[fragment]

    def start(self, t: float) -> list[Action]:
        if self._started:
            raise SchedulerError("start: the scheduler was already started")
        self._started, self._now = True, t
        return self._fill(t, set(self.plan.trainers))

    def on_event(self, event: Event) -> list[Action]:
        if not self._started:
            raise SchedulerError("on_event: call start(t) first")
        if event.time < self._now - 1e-9 * max(1.0, abs(self._now)):
            raise SchedulerError(f"event time {event.time} is before the previous event ({self._now})")
        self._now = t = max(self._now, event.time)
        if isinstance(event, FragmentGenerated):
            return self._on_fragment(t, event)
        if isinstance(event, ChunkTrained):
            return self._on_chunk(t, event)
        if isinstance(event, Committed):
            return self._on_committed(t, event)
        if isinstance(event, Published):
            return self._on_published(t, event)
        raise SchedulerError(f"unknown event {event!r}")

    # ---- event handlers ----------------------------------------------------------------------------
    def _finish(self, worker: str, kind: type, what) -> None:
        cur = self._busy.get(worker, "unknown")
        if cur == "unknown":
            raise SchedulerError(f"unknown worker {worker!r}")
        if cur is None or not isinstance(cur[0], kind) or (cur[0].fragment if kind is Generate
                                                           else cur[0].chunk) != what:
            raise SchedulerError(f"worker {worker!r} was not running {what!r} (running {cur!r})")
        self._busy[worker] = None

    def _on_fragment(self, t: float, e: FragmentGenerated) -> list[Action]:
        self._finish(e.worker, Generate, e.fragment)
        freed: set[str] = set()
        if self.plan.is_trainer(e.worker):
            self._last_gen[e.worker] = True
            freed.add(e.worker)
        s, g = e.fragment.step, e.fragment.group
        self._outstanding[(s, g)] -= 1
        if self._outstanding[(s, g)] == 0:
            self._group_done(t, s, g)
        return self._fill(t, freed)

    def _on_chunk(self, t: float, e: ChunkTrained) -> list[Action]:
        self._finish(e.rank, Train, e.chunk)
        self._last_gen[e.rank] = False
        s = e.chunk.step
        self._chunks_left[s] -= 1
        if self._chunks_left[s] == 0:
            if any(self._busy[r] is not None for r in self.plan.trainers):
                raise SchedulerError(f"step {s}: all chunks trained while a trainer rank is busy")
            self._collective = "commit"
            ranks = self.plan.trainers
            act = Commit(s, ranks, tuple(self._stale.get(s, ())))
            return [act]
        return self._fill(t, {e.rank})

    def _on_committed(self, t: float, e: Committed) -> list[Action]:
        if self._collective != "commit" or e.step != self.train_step:
            raise SchedulerError(f"unexpected Committed(step={e.step}); training step is {self.train_step}")
        self.stats[e.step].committed = t
        if self.bts:
            self.bts.record_commit(e.step, t)
        self.train_step += 1
        for g in self._held.pop(self.train_step, []):
            self._release(self.train_step, g)
        self._collective = "publish"
        return [Publish(e.step + 1, self.plan.trainers, self.plan.generators)] + self._fill(t, set())

    def _on_published(self, t: float, e: Published) -> list[Action]:
        if self._collective != "publish" or e.version != self.train_step:
            raise SchedulerError(f"unexpected Published(version={e.version}); expected {self.train_step}")
        self._collective = None
        self.published = e.version
        self.stats[e.version - 1].published = t
        if self.done:
            return []
        return self._fill(t, set(self.plan.trainers))

    # ---- work bookkeeping --------------------------------------------------------------------------
    def _pending_of(self, step: int) -> deque[Fragment]:
        q = self._pending.get(step)
        if q is None:
            frags = step_fragments(self.plan, step) if 0 <= step < self.plan.steps else []
            q = self._pending[step] = deque(frags)
            for fr in frags:
                key = (step, fr.group)
                self._outstanding[key] = self._outstanding.get(key, 0) + 1
            self._groups_left[step] = self.plan.prompts
            if self.plan.mode.tsp:
                self._chunks_left[step] = len(tsp_chunks(self.plan, step, 0)) * self.plan.prompts
            else:
                self._chunks_left[step] = sum(len(v) for g in range(self.plan.prompts)
                                              for v in classic_chunks(self.plan, step, g).values())
        return q

    def _group_done(self, t: float, s: int, g: int) -> None:
        self._groups_left[s] -= 1
        if self._groups_left[s] == 0:
            self.stats[s].rewards_in = t
        if not self.plan.mode.pipelined:
            if self._groups_left[s] == 0:  # full-batch barrier
                for grp in range(self.plan.prompts):
                    self._release(s, grp)
        elif s == self.train_step:
            self._release(s, g)
        else:  # TCSS: a group of the next step, trainable only after this step's commit
            self._held.setdefault(s, []).append(g)

    def _release(self, s: int, g: int) -> None:
        if self.plan.mode.tsp:
            self._ready.extend(tsp_chunks(self.plan, s, g))
        else:
            for ri, chunks in classic_chunks(self.plan, s, g).items():
                self._rank_ready[self.plan.trainers[ri]].extend(chunks)

    def _next_chunk(self, rank: str) -> Chunk | None:
        q = self._ready if self.plan.mode.tsp else self._rank_ready[rank]
        return q.popleft() if q else None

    def _next_generator_work(self) -> tuple[Fragment, int] | None:
        """On-policy work of the published version's step; else (TCSS) stale work of the next step."""
        v, p = self.published, self.plan
        cur = self._pending_of(v)
        if cur:
            return cur.popleft(), v
        if p.mode.tcss and v + 1 < p.steps:
            nxt = self._pending_of(v + 1)
            if nxt and self._stale_gens.get(v + 1, 0) + nxt[0].size <= p.stale_cap:
                return nxt.popleft(), v
        return None

    def _dispatch(self, t: float, frag: Fragment, worker: str, version: int, tag: bool = False,
                  switch: bool = False) -> Generate:
        act = Generate(frag, worker, version, tag, switch)
        self._busy[worker] = (act, t)
        self._version[frag] = version
        st = self.stats[frag.step]
        if st.first_dispatch is None:
            st.first_dispatch = t
        st.fragments += 1
        if tag:
            st.tag_fragments += 1
            st.tag_generations += frag.size
        if act.stale:
            st.stale_fragments += 1
            st.stale_generations += frag.size
            self._stale_gens[frag.step] = self._stale_gens.get(frag.step, 0) + frag.size
            self._stale.setdefault(frag.step, []).append(frag)
        return act

    def _train(self, t: float, chunk: Chunk, rank: str) -> Train:
        act = Train(chunk, rank)
        self._busy[rank] = (act, t)
        self.stats[chunk.step].chunks += 1
        return act

    # ---- the policy --------------------------------------------------------------------------------
    def _rank_idle(self, r: str) -> bool:
        return self._busy[r] is None and self._collective is None

    def _fill(self, t: float, freed: set[str]) -> list[Action]:
        p, acts = self.plan, []
        if p.mode is Mode.COLOCATED:
            for r in p.trainers:
                if not self._rank_idle(r):
                    continue
                chunk = self._next_chunk(r)
                if chunk is not None:
                    acts.append(self._train(t, chunk, r))
                elif self.published == self.train_step and self._pending_of(self.published):
                    frag = self._pending_of(self.published).popleft()
                    acts.append(self._dispatch(t, frag, r, self.published, switch=not self._last_gen[r]))
            return acts
        for w in p.generators:
            if self._busy[w] is None:
                work = self._next_generator_work()
                if work is None:
                    break
                acts.append(self._dispatch(t, work[0], w, work[1]))
        for r in p.trainers:
            if not self._rank_idle(r):
                continue
            chunk = self._next_chunk(r)
            if chunk is not None:
                acts.append(self._train(t, chunk, r))
            elif self._tag_queue[r]:
                acts.append(self._dispatch(t, self._tag_queue[r].popleft(), r, self.train_step, tag=True,
                                           switch=not self._last_gen[r]))
        if self.bts is not None and self._collective is None and any(self._rank_idle(r) for r in freed):
            acts.extend(self._bubble(t))
        return acts

    def _bubble(self, t: float) -> list[Action]:
        """A trainer rank is about to idle: ask BTS how many pending fragments to hand to idle ranks."""
        s = self.train_step
        pending = self._pending_of(s)
        if not pending or s >= self.plan.steps or self.published != s:
            return []
        snap = self._snapshot(t)
        decision = self.bts.decide(snap)
        self.stats[s].bubbles += 1
        acts = []
        for ri in tag_targets(snap, decision.k):
            r = self.plan.trainers[ri]
            self._tag_queue[r].append(pending.popleft())
            acts.append(self._dispatch(t, self._tag_queue[r].popleft(), r, s, tag=True,
                                       switch=not self._last_gen[r]))
        return acts

    def _snapshot(self, t: float) -> Snapshot:
        s, dur = self.train_step, self._dur
        gens = []
        for w in self.plan.generators:
            cur = self._busy[w]
            if cur is None:
                gens.append((t, -1))
            else:
                act, t0 = cur  # predicted end; never before now (real work can overrun its estimate)
                gens.append((max(t, t0 + dur.of(act)), act.fragment.group if act.fragment.step == s else -1))
        ranks, idle = [], []
        for i, r in enumerate(self.plan.trainers):
            cur = self._busy[r]
            if cur is None:
                ranks.append((t, -1, self._last_gen[r]))
                idle.append(i)
            elif isinstance(cur[0], Generate):
                ranks.append((max(t, cur[1] + dur.of(cur[0])), cur[0].fragment.group, True))
            else:
                ranks.append((max(t, cur[1] + dur.of(cur[0])), -1, False))
        ready: list[int] = []
        last = None
        for c in self._ready:
            if c.group == last:
                ready[-1] += 1
            else:
                ready.append(1)
                last = c.group
        incomplete = tuple(g for g in range(self.plan.prompts) if self._outstanding.get((s, g), 0) > 0)
        pending = tuple((f.group, f.size) for f in self._pending_of(s))
        return Snapshot(t, s, pending, tuple(gens), tuple(ranks), tuple(idle), tuple(ready), incomplete)
