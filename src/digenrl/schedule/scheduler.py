"""The scheduler: a pure state machine from events to actions (see the package docstring for the API)."""

from __future__ import annotations

import itertools
import time
from collections import deque
from typing import Callable

from .actions import Action, ChunkTrained, Commit, Committed, Event, FragmentGenerated, Generate, Publish
from .actions import Published, Train
from .bts import BTS, BTSConfig, BTSStats
from . import stale_hold
from .bts_model import Snapshot, StepModel, tag_targets
from .cost import CostModel, Durations
from .layout import Chunk, Fragment, classic_cells, classic_chunks, gang_parts, gang_size, tsp_chunks
from .online_cost import OnlineCosts
from .plan import StepPlan
from .snapshot import take_snapshot
from .step_work import StepStats, StepWork
from .tag_policy import FixedRule, make_tag_policy


class SchedulerError(RuntimeError):
    """An event that does not match the scheduler's state (wrong worker, unknown work, time going back)."""


class Scheduler:
    """Drives one run of ``plan``. ``cost`` is required in TAG modes (BTS predicts with it). ``bts_config``
    also names the TAG decision policy (``BTSConfig.policy``: bts, greedy, none; ``tag_policy``) and, with
    ``BTSConfig.online``, lets the cost model follow the run's own action times (``online_cost``: refined at
    every step's final commit, used by the snapshots and BTS from the next step on)."""

    def __init__(self, plan: StepPlan, cost: CostModel | None = None, bts_config: BTSConfig | None = None,
                 bts_clock: Callable[[], float] = time.perf_counter, first_step: int = 0):
        """``first_step``: steps before it are committed and published already (a resumed or recovered run:
        the weights are version ``first_step``)."""
        if plan.mode.tag and cost is None:
            raise ValueError(f"cost: mode {plan.mode.value!r} needs a cost model (BTS predicts with it)")
        self.plan = plan
        self._tsp, self._trainer_set = plan.mode.tsp, frozenset(plan.trainers)  # (hot-path constants of the plan)
        self._dur = Durations(plan, cost) if cost is not None else None
        # TCSS with a joined publish: a stale fragment that would hold up the publish waits (``stale_hold``)
        self._hold_model = StepModel(plan, self._dur) if self._dur is not None and stale_hold.applies(plan) else None
        self.bts: BTS | FixedRule | None = (make_tag_policy(plan, cost, bts_config, bts_clock)
                                            if plan.mode.tag else None)
        bc = bts_config or BTSConfig()
        self._online = OnlineCosts(plan, cost, bc.online_decay) if plan.mode.tag and bc.online else None
        self._collective_launch: tuple[Action, float] | None = None  # the Commit / Publish in flight, its launch time
        self.stats = [StepStats(k, generations=plan.batch) for k in range(plan.steps)]
        if not 0 <= first_step <= plan.steps:
            raise ValueError(f"first_step: {first_step} is outside 0..{plan.steps}")
        self.train_step = first_step  # the step whose chunks the trainers work on (= committed steps)
        self.round = 0               # its training round (minibatch x epoch; one commit each)
        self.published = first_step  # the newest version the generators hold
        self._now = float("-inf")
        self._started = False
        self._steps: dict[int, StepWork] = {}   # per step, until it is published
        self._ready: deque[Chunk] = deque()     # TSP: chunks any rank may train
        self._rank_ready = {r: deque() for r in plan.trainers}  # classic layout: each rank's own chunks
        self._busy: dict[str, tuple[Action, float] | None] = {w: None for w in plan.generators + plan.trainers}
        self._last_gen = {r: False for r in plan.trainers}
        self._collective: str | None = None  # "commit" / "publish" while the trainer ranks are in one
        self._held: tuple[str, ...] = ()     # the workers of that collective (``Action.workers``)
        self._pending_publish: Publish | None = None  # issued, not launched (waits for the generators to join)

    # ---- public API --------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._started and self.published >= self.plan.steps

    @property
    def bts_stats(self) -> BTSStats | None:
        return self.bts.stats if self.bts else None

    @property
    def cost_scales(self) -> dict[str, float]:
        """The online factors in effect (action kind -> observed / profiled seconds; empty: none yet or off)."""
        return dict(self._online.scales) if self._online else {}

    def start(self, t: float) -> list[Action]:
        if self._started:
            raise SchedulerError("start: the scheduler was already started")
        self._started, self._now = True, t
        self._start_round(self.train_step, 0)
        return self._fill(t, set(self.plan.trainers))

    def on_event(self, event: Event) -> list[Action]:
        if not self._started:
            raise SchedulerError("on_event: call start(t) first")
        if event.time < self._now - 1e-9 * max(1.0, abs(self._now)):
            raise SchedulerError(f"event time {event.time} is before the previous event ({self._now})")
        self._now = max(self._now, event.time)
        kind = type(event)
        if kind is ChunkTrained:
            return self._on_chunk(self._now, event)
        if kind is FragmentGenerated:
            return self._on_fragment(self._now, event)
        if kind is Committed:
            return self._on_committed(self._now, event)
        if kind is Published:
            return self._on_published(self._now, event)
        raise SchedulerError(f"unknown event {event!r}")

    # ---- event handlers ----------------------------------------------------------------------------
    def _finish(self, t: float, worker: str, e: Event) -> Action:
        """The action ``e`` reports, checked and taken off ``worker``."""
        cur = self._busy.get(worker, "unknown")
        if cur == "unknown":
            raise SchedulerError(f"unknown worker {worker!r}")
        if cur is None or cur[0].event(e.time) != e:  # the event reports the action the worker runs
            raise SchedulerError(f"worker {worker!r} was not running what {e!r} reports (running {cur!r})")
        self._busy[worker] = None
        if self._online:
            self._online.observe(cur[0], t - cur[1])
        return cur[0]

    def _finish_collective(self, t: float) -> None:
        if self._online and self._collective_launch is not None:
            self._online.observe(self._collective_launch[0], t - self._collective_launch[1])
        self._collective_launch = None

    def _refine_costs(self) -> None:
        """A step's final commit: fold its action times into the online model; a changed model prices the
        snapshots and BTS's predictions from now on."""
        new = self._online.end_step() if self._online else None
        if new is not None:
            self._dur = Durations(self.plan, new)
            self.bts.set_cost(new)
            if self._hold_model is not None:
                self._hold_model = StepModel(self.plan, self._dur)

    def _on_fragment(self, t: float, e: FragmentGenerated) -> list[Action]:
        act = self._finish(t, e.worker, e)
        freed: set[str] = set()
        if e.worker in self._trainer_set:  # ``plan.is_trainer``
            self._last_gen[e.worker] = True
            freed.add(e.worker)
        for f in act.fragments:  # a gang over several groups: every part is in
            s, g = f.step, f.group
            work = self._work(s)
            work.outstanding[g] -= f.size
            if work.outstanding[g] == 0:
                self._group_done(s, g)
        return self._maybe_commit() + self._launch_publish(t) + self._fill(t, freed)

    def _on_chunk(self, t: float, e: ChunkTrained) -> list[Action]:
        self._finish(t, e.rank, e)
        self._last_gen[e.rank] = False
        self._work(e.chunk.step).chunks_left -= 1
        return self._maybe_commit() + self._launch_publish(t) + self._fill(t, {e.rank})

    def _maybe_commit(self) -> list[Action]:
        """The round's chunks are all trained and every rank is free (a TAG fragment in flight finishes
        first: the commit is a collective of all ranks) and, with step-wide advantages, every reward of the
        step is in: commit the round."""
        s = self.train_step
        if s >= self.plan.steps or self._collective is not None or self._work(s).chunks_left > 0:
            return []
        if self.plan.step_wide and self._work(s).groups_left > 0:
            return []  # the commit rescales by statistics of the whole step: it waits for its last reward
        if any(self._busy[r] is not None for r in self.plan.trainers):
            return []
        self._collective = "commit"
        final = self.round == self.plan.rounds - 1
        commit = Commit(s, self.plan.trainers, self.round, final)
        self._held = commit.workers
        self._collective_launch = (commit, self._now)
        return [commit]

    def _on_committed(self, t: float, e: Committed) -> list[Action]:
        if self._collective != "commit" or e.step != self.train_step or e.round != self.round:
            raise SchedulerError(f"unexpected Committed(step={e.step}, round={e.round}); training step is "
                                 f"{self.train_step}, round {self.round}")
        self.stats[e.step].commits += 1
        self._finish_collective(t)
        if self.round < self.plan.rounds - 1:  # a minibatch's commit: the next round trains with its weights
            self._collective, self._held = None, ()
            self._start_round(self.train_step, self.round + 1)
            return self._fill(t, set(self.plan.trainers))
        self.stats[e.step].committed = t
        if self.bts:
            self.bts.stats.realized[e.step] = t
        self._refine_costs()
        self.train_step += 1
        self._start_round(self.train_step, 0)
        self._collective = "publish"
        p = self.plan
        self._pending_publish = Publish(e.step + 1, p.trainers, p.generators, p.publish_joins, p.publish_streams)
        self._held = self._pending_publish.workers
        return self._launch_publish(t) + self._fill(t, set())

    def _launch_publish(self, t: float) -> list[Action]:
        """The step's publish, once it may start: at once, or (``plan.publish_joins``: the generators take part)
        when the last generator's in-flight fragment is done; until then no generator gets work. A streamed
        publish (``plan.publish_streams``) does not wait for the trainer ranks, which go on during it."""
        publish = self._pending_publish
        if publish is None or any(self._busy[w] is not None for w in publish.workers):
            return []
        self._pending_publish = None
        self._collective_launch = (publish, t)
        return [publish]

    def _on_published(self, t: float, e: Published) -> list[Action]:
        if self._collective != "publish" or e.version != self.train_step:
            raise SchedulerError(f"unexpected Published(version={e.version}); expected {self.train_step}")
        self._collective, self._held = None, ()
        self._finish_collective(t)
        self.published = e.version
        self.stats[e.version - 1].published = t
        self._steps.pop(e.version - 1, None)  # nothing of that step is asked for again
        if self.done:
            return []
        # chunks trained while a joined publish waited may have finished a round: its commit is due now
        return self._maybe_commit() + self._fill(t, set(self.plan.trainers))

    # ---- work bookkeeping --------------------------------------------------------------------------
    def _work(self, step: int) -> StepWork:
        """The step's work state, created when the step is first looked at (an empty one past the last step)."""
        work = self._steps.get(step)
        if work is None:
            work = self._steps[step] = StepWork.start(self.plan, step)
        return work

    def _start_round(self, s: int, r: int) -> None:
        """Round ``r`` of step ``s`` begins: count its chunks and release those of its complete groups."""
        self.round = r
        if s >= self.plan.steps:
            return
        if r == 0 and self._online:
            self.stats[s].cost_scales = dict(self._online.scales)
        p, work = self.plan, self._work(s)
        groups = p.round_groups(r)
        if p.mode.tsp:
            work.chunks_left = len(tsp_chunks(p, s, 0)) * len(groups)
        else:
            work.chunks_left = sum(len(v) for g in groups for v in classic_cells(p, g).values())
        for g in groups:  # those whose rewards are in (barrier modes: every group's)
            if g in work.done if p.mode.pipelined else work.groups_left == 0:
                self._release(s, g)

    def _group_done(self, s: int, g: int) -> None:
        work = self._work(s)
        work.groups_left -= 1
        work.done.add(g)
        if s != self.train_step:  # TCSS: a group of the next step, released when that step's rounds begin
            return
        current = self.plan.round_groups(self.round)
        if self.plan.mode.pipelined:
            if g in current:
                self._release(s, g)
        elif work.groups_left == 0:  # full-batch barrier
            for grp in current:
                self._release(s, grp)

    def _release(self, s: int, g: int) -> None:
        if self.plan.mode.tsp:
            self._ready.extend(tsp_chunks(self.plan, s, g, self.round))
        else:
            for ri, chunks in classic_chunks(self.plan, s, g, self.round).items():
                self._rank_ready[self.plan.trainers[ri]].extend(chunks)

    def _next_chunk(self, rank: str) -> Chunk | None:
        q = self._ready if self._tsp else self._rank_ready[rank]
        return q.popleft() if q else None

    def _next_generator_work(self, t: float) -> tuple[Fragment, int] | None:
        """On-policy work of the published version's step; else (TCSS) stale work of the next step, unless
        it would hold up a joined publish (``stale_hold``)."""
        v, p = self.published, self.plan
        cur = self._work(v).pending
        if cur:
            return cur.popleft(), v
        if p.mode.tcss and v + 1 < p.steps:
            nxt = self._work(v + 1)
            if nxt.pending and nxt.stale_generations + nxt.pending[0].size <= p.stale_cap:
                if self._holds_stale(t, nxt.pending[0].size):
                    return None
                return nxt.pending.popleft(), v
        return None

    def _holds_stale(self, t: float, size: int) -> bool:
        if self._hold_model is None or self.train_step != self.published:
            return False
        if self._collective == "commit":
            launch = self._collective_launch
            return launch is not None and stale_hold.hold(self.plan, self._hold_model, t, size,
                                                          launch[1] + self._dur.of(launch[0]), None)
        if self._collective is not None:
            return False
        return stale_hold.hold(self.plan, self._hold_model, t, size, None, self._snapshot(t))

    def _dispatch(self, t: float, frag: Fragment, worker: str, version: int, tag: bool = False,
                  switch: bool = False, parts: int = 1, more: tuple[Fragment, ...] = ()) -> Generate:
        """``parts``: the plan fragments the action merges (a gang TAG action on a shard group; ``more``: its
        parts of later groups)."""
        act = Generate(frag, worker, version, tag, switch, more)
        self._busy[worker] = (act, t)
        st = self.stats[frag.step]
        if st.first_dispatch is None:
            st.first_dispatch = t
        st.fragments += parts
        if tag:
            st.tag_fragments += parts
        if act.stale:
            st.stale_generations += frag.size
            work = self._work(frag.step)
            work.stale_generations += frag.size
        return act

    def _train(self, t: float, chunk: Chunk, rank: str) -> Train:
        act = Train(chunk, rank)
        self._busy[rank] = (act, t)
        return act

    # ---- the policy --------------------------------------------------------------------------------
    def _idle(self, w: str) -> bool:
        """Free for work: no action of its own and not held by a collective (``Publish.workers``: who a publish
        holds)."""
        return self._busy[w] is None and w not in self._held

    def _fill(self, t: float, freed: set[str]) -> list[Action]:
        """Hand work to idle workers: generators take the next fragment; a trainer rank takes a ready chunk
        first, else (colocated) the next fragment of the step; then BTS may hand fragments to idle ranks."""
        p, acts = self.plan, []
        busy, held = self._busy, self._held  # (``_idle`` inlined; nothing below changes ``_held``)
        for w in p.generators:
            if busy[w] is None and w not in held:
                work = self._next_generator_work(t)
                if work is None:
                    break
                acts.append(self._dispatch(t, work[0], w, work[1]))
        for r in p.trainers:
            idle = busy[r] is None and r not in held
            chunk = self._next_chunk(r) if idle else self._join_wait_chunk(t) if busy[r] is None else None
            if chunk is not None:
                acts.append(self._train(t, chunk, r))
            elif (idle and not p.mode.disaggregated and self.published == self.train_step
                  and self._work(self.published).pending):
                pending = self._work(self.published).pending  # (packed: the worker's share in one action)
                m = min(len(pending), p.colocated_share) if p.packed else 1
                parts = gang_parts([pending.popleft() for _ in range(m)])
                acts.append(self._dispatch(t, parts[0], r, self.published, switch=not self._last_gen[r], parts=m,
                                           more=parts[1:]))
        if self.bts is not None and self._collective is None and any(self._idle(r) for r in freed):
            acts.extend(self._bubble(t))
        return acts

    def _join_wait_chunk(self, t: float) -> Chunk | None:
        """While a joined publish waits for the generators' in-flight (TCSS) fragments, a free trainer rank trains a
        ready chunk of the next step (its weights are that step's, committed) if the chunk ends by the last
        generator's predicted end, so the publish is not held up; None otherwise."""
        if self._pending_publish is None or not self.plan.publish_joins or self._dur is None or not self._ready:
            return None
        busy = [self._busy[w] for w in self.plan.generators if self._busy[w] is not None]
        ends = [t0 + self._dur.of(a) for a, t0 in busy]
        if not ends or t + self._dur.train(self._ready[0].size) > max(ends) + 1e-9 * max(1.0, abs(t)):
            return None
        return self._ready.popleft()

    def _bubble(self, t: float) -> list[Action]:
        """A trainer rank is about to idle: ask the TAG policy how many pending fragments to hand to idle ranks."""
        s = self.train_step
        pending = self._work(s).pending
        if not pending or s >= self.plan.steps or self.published != s or self.round > 0:
            return []  # after a minibatch's commit the ranks' weights are no longer the published version
        if self._work(s).chunks_left == 0:
            return []  # the round waits for its commit
        snap = self._snapshot(t)
        decision = self.bts.decide(snap)
        acts = []
        current = set(self.plan.round_groups(self.round))
        n = self.plan.shard_ranks
        for ri in tag_targets(snap, decision.k):
            # only fragments this round trains: a TAG fragment of a later minibatch could hold up this round's
            # commit (a collective); a shard group takes a gang of up to one fragment per rank (layout.gang_size)
            m = gang_size([(f.group, f.size) for f in itertools.islice(pending, n)], n, current,
                          self.plan.gang_groups)
            if m == 0:
                break
            parts = gang_parts([pending.popleft() for _ in range(m)])
            r = self.plan.trainers[ri]
            acts.append(self._dispatch(t, parts[0], r, s, tag=True, switch=not self._last_gen[r], parts=m,
                                       more=parts[1:]))
        return acts

    def _snapshot(self, t: float) -> Snapshot:
        return take_snapshot(self.plan, self._dur, t, self.train_step, self._busy, self._last_gen, self._ready,
                             self._work(self.train_step))
