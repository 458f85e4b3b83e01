"""What BTS reasons about: a snapshot of the current step, its exact no-TAG prediction, and the compressed
state the search memoizes on (docs/architecture.md, "BTS").

Within step k (TSP modes, the only ones with TAG) the scheduler's policy is two greedy list schedules:

1. rollout: each generator, when free, takes the next pending fragment (dispatch order); a fragment's end is
   ``free + Generate(size)``; a group's rewards are in at the max end over its fragments;
   A TAG action on a shard group of N ranks takes a gang: the next min(N, pending) fragments, of one or
   several groups (``layout.gang_size``), generated together, ending together.
2. training: chunks enter the FIFO ready queue when their group completes (groups in completion order) and
   the earliest-free trainer rank takes the head: ``start = max(free, release)``, ``end = start + Train(c)``.

The commit of the step ends at ``max(chunk ends) + Commit``. ``no_tag_commit`` evaluates this, assuming no
further TAG decision ("SkipBubble from now on"), once for both of its users: ``StepModel.predict_commit`` in
seconds (exact: the same float operations as the simulator; the safety check that makes BTS never worse than no
TAG with exact costs) and ``TickModel.leaf`` in integer ticks (the search's V_0).

The search works on ``State``: the same situation relative to *now* in integer ticks of ``quantum`` seconds,
with groups renumbered from the first incomplete one, and only counts where identities do not matter:

    State = (nxt, left, gens, ranks, ready)
      nxt   pending fragments start at this index (relative to the first incomplete group x F)
      left  groups from the first incomplete one to the end of the step
      gens  sorted (end tick, group) of generators busy with this step's fragments
      ranks sorted (end tick, groups of its in-flight TAG action or (), last action was Generate) of all
            trainer ranks (idle: end 0)
      ready remaining chunk counts per ready group, in queue order

Equal situations (up to a shift of time and group numbering, and up to the quantum) give equal States.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import Counter
from dataclasses import dataclass

from .cost import Durations
from .layout import gang_size, tsp_chunks
from .plan import StepPlan

State = tuple  # (nxt, left, gens, ranks, ready), see module docstring
MEMO_LIMIT = 200_000  # ``TickModel``'s results of ``advance`` and ``leaf`` are dropped past this many of each


@dataclass(frozen=True)
class Snapshot:
    """The scheduler's view of the current step at a bubble (absolute times, seconds).

    pending: (group, size) of the step's undispatched fragments in dispatch order.
    generators: per generator, (free time, group of its in-flight fragment of this step, or -1).
    ranks: per trainer rank in plan order, (free time, groups of its in-flight TAG action (a gang may span
      several) or (), last action was a Generate). idle: indices of ranks that are idle now (free, no work).
    ready: remaining chunk counts per group in ready-queue order (a group's chunks enter the queue together,
      in tiling order, and leave from the head, so its ready chunks are the last ``n`` of its tiling).
    incomplete: groups whose rewards are not all in.
    """

    now: float
    step: int
    pending: tuple[tuple[int, int], ...]
    generators: tuple[tuple[float, int], ...]
    ranks: tuple[tuple[float, tuple[int, ...], bool], ...]
    idle: tuple[int, ...]
    ready: tuple[int, ...]
    incomplete: tuple[int, ...]


def tag_targets(snap: Snapshot, k: int) -> list[int]:
    """The idle ranks that receive the k TAG fragments: ranks already in generation mode first (no switch)."""
    order = sorted(snap.idle, key=lambda r: (not snap.ranks[r][2], r))
    return order[:k]


class StepModel:
    """Static structure of a step (fragment and chunk sizes) priced by ``Durations``."""

    def __init__(self, plan: StepPlan, dur: Durations):
        self.plan, self.dur = plan, dur
        g, f = plan.generations, plan.fragment_size
        self.frag_sizes = tuple(min(f, g - lo) for lo in range(0, g, f))  # per position in a group
        self.F = len(self.frag_sizes)
        self.P = plan.prompts
        self.chunk_sizes = tuple(c.size for c in tsp_chunks(plan, 0, 0))
        self.C = len(self.chunk_sizes)
        self.n_gen, self.n_rank = len(plan.generators), len(plan.trainers)
        # several minibatch rounds per step: BTS decides only in round 0, and its exact check predicts the end
        # of round 0's commit (the later rounds start after it and only use generator work TAG never delays)
        self.round0 = frozenset(plan.round_groups(0)) if plan.rounds > 1 else None

    # ---- exact prediction (absolute float seconds) ---------------------------------------------------
    def predict_commit(self, snap: Snapshot, k: int) -> float:
        """End of the step's commit if ``k`` pending fragments go to idle ranks now and no TAG follows (several
        minibatch rounds per step: the end of round 0's commit, training only round 0's groups)."""
        dur, now = self.dur, snap.now
        done: dict[int, float] = {}
        rank_free = [r[0] for r in snap.ranks]
        for r, (end, grps, _) in enumerate(snap.ranks):
            for grp in grps:
                done[grp] = max(done.get(grp, end), end)
        pend, i, n = snap.pending, 0, self.plan.shard_ranks
        for r in tag_targets(snap, k):  # the scheduler's TAG dispatch: a gang per target, this round's groups
            head = pend[i:i + n]
            m = gang_size(head, n, self.round0, self.plan.gang_groups)
            if m == 0:
                break
            size = sum(sz for _, sz in head[:m])
            end = now + dur.generate(size, True, not snap.ranks[r][2])
            rank_free[r] = end
            for grp, _ in head[:m]:
                done[grp] = max(done.get(grp, end), end)
            i += m
        gens = []
        for end, grp in snap.generators:
            gens.append(end)
            if grp >= 0:
                done[grp] = max(done.get(grp, end), end)
        pending = [(grp, [dur.generate(size, False, False) for _, size in run])
                   for grp, run in itertools.groupby(pend[i:], key=lambda f: f[0])]
        trained = [g for g in snap.incomplete if self.round0 is None or g in self.round0]
        wait = snap.incomplete if self.plan.step_wide else ()  # the commit waits for the step's last reward
        return no_tag_commit(gens, pending, done, rank_free, snap.ready, [dur.train(c) for c in self.chunk_sizes],
                             dur.commit(final=self.plan.rounds == 1), now=now, trained=trained, wait=wait)


def no_tag_commit(gens: list, pending, done: dict, ranks: list, ready, chunk, commit, *, now=0, trained=None,
                  wait=(), uniform: int | None = None):
    """End of the step's commit if no TAG is inserted from ``now`` on (the module docstring's two list schedules),
    in seconds (``StepModel.predict_commit``) or integer ticks (``TickModel.leaf``), the same operations::

        rollout   e = min(gens) + Generate(f) per pending f, in order;  done[g] = max(done[g], its fragments' e)
        training  ready chunks (released at now), then each trained group's chunks in (done, group) order, each
                  on the earliest-free rank: end = max(free, release) + Train(c)
        commit    max(max(ranks), max(done[g] for g in wait)) + Commit

    pending: (group, generate times of its pending fragments) in dispatch order; done: group -> end of its work in
    flight; ready: remaining chunk counts per ready group, in queue order; chunk: train times of a group's chunks;
    trained: None for every group of ``done``; wait: step-wide statistics; uniform: every chunk's ticks when they
    are equal (integers only: the closed form ``_equal_jobs``). Reorders ``gens`` and ``ranks``, completes ``done``.
    """
    heapq.heapify(gens)
    replace = heapq.heapreplace
    for g, times in pending:
        last = done.get(g, -math.inf)
        for d in times:
            e = gens[0] + d
            replace(gens, e)
            if e > last:
                last = e
        done[g] = last
    order = sorted((done[g], g) for g in (done if trained is None else trained))
    C = len(chunk)
    if uniform is not None:
        ranks.sort()
        _equal_jobs(ranks, sum(ready), uniform, now)
        for rel, _ in order:
            _equal_jobs(ranks, C, uniform, rel)
        end = ranks[-1]
    else:
        heapq.heapify(ranks)
        for rem in ready:
            for c in chunk[C - rem:]:
                s = ranks[0]
                replace(ranks, (s if s > now else now) + c)
        for rel, _ in order:
            for c in chunk:
                s = ranks[0]
                replace(ranks, (s if s > rel else rel) + c)
        end = max(ranks)
    for g in wait:
        if done[g] > end:
            end = done[g]
    return end + commit


def _equal_jobs(free: list[int], n: int, c: int, release: int) -> None:
    """``n`` jobs of ``c`` ticks released at ``release``, each on the earliest-free rank (``free``: the ranks'
    free ticks, sorted; updated in place, still sorted): the greedy list schedule of ``leaf``, in closed form.
    A rank free before the release starts at it (raising it to ``release`` first changes no start). While the
    free ticks spread over more than c, the earliest rank takes the next job; once within c of each other the
    ranks take jobs in free order, round after round: q = n // N rounds add q c to every rank and the n mod N
    earliest take one more (their ends come after every other rank's, so the list stays sorted)."""
    if n <= 0:
        return
    k = bisect.bisect_left(free, release)
    free[:k] = [release] * k
    while n and free[-1] - free[0] > c:
        bisect.insort(free, free.pop(0) + c)
        n -= 1
    if n:
        q, s = divmod(n, len(free))
        free[:] = [e + q * c for e in free[s:]] + [e + (q + 1) * c for e in free[:s]]


class TickModel:
    """The step structure in integer ticks, and the abstract dynamics the search explores."""

    def __init__(self, model: StepModel, quantum: float):
        if not quantum > 0:
            raise ValueError(f"quantum: must be > 0 (got {quantum!r})")
        self.q, self.m = quantum, model
        d = model.dur
        self.gen = tuple(self.ticks(d.generate(s, False, False)) for s in model.frag_sizes)
        self.tag = tuple(self.ticks(d.generate(s, True, False)) for s in model.frag_sizes)
        self.switch = {s: self.ticks(d.generate(s, True, True)) for s in model.frag_sizes}
        self.shard_ranks = model.plan.shard_ranks
        self.gang_groups = model.plan.gang_groups
        self._gang: dict[tuple[int, int, bool], int] = {}
        self.chunk = tuple(self.ticks(d.train(c)) for c in model.chunk_sizes)
        self._uniform = self.chunk[0] if self.chunk and len(set(self.chunk)) == 1 else None  # every chunk c ticks
        self.commit = self.ticks(d.commit(final=model.plan.rounds == 1))
        self.F, self.C, self.P = model.F, model.C, model.P
        self.n_gen, self.n_rank = model.n_gen, model.n_rank
        # ``advance`` and ``leaf`` are pure functions of their arguments and this model's ticks, and the search
        # asks again for the same ones (iterative deepening re-expands every state of the shallower rankings,
        # and later bubbles reach states seen before): their results are kept (cleared past MEMO_LIMIT entries)
        self._advanced: dict[tuple[State, int], tuple[int, State | None]] = {}
        self._leaves: dict[State, int] = {}

    def gang_ticks(self, pos: int, m: int, in_generation: bool) -> int:
        """Ticks of a TAG action of the m fragments from position ``pos`` of a group on, into the following
        groups where the group ends (m = 1: one fragment; a switch into generation mode unless the rank's last
        action generated)."""
        if m == 1:
            return self.tag[pos] if in_generation else self.switch[self.m.frag_sizes[pos]]
        key = (pos, m, in_generation)
        if key not in self._gang:
            sizes, F = self.m.frag_sizes, self.F
            size = sum(sizes[(pos + j) % F] for j in range(m))
            self._gang[key] = self.ticks(self.m.dur.generate(size, True, not in_generation))
        return self._gang[key]

    def ticks(self, seconds: float) -> int:
        return max(1, int(round(seconds / self.q)))

    def rel(self, t: float, now: float) -> int:
        return max(0, int(round((t - now) / self.q)))

    # ---- compression -------------------------------------------------------------------------------
    def compress(self, snap: Snapshot) -> State:
        """Snapshot -> State (relative, quantized, renumbered). Groups before the first incomplete one are done."""
        F, now = self.F, snap.now
        first = min([g for g, _ in snap.pending[:1]] + list(snap.incomplete) + [self.P])
        pend_abs = self.P * F - len(snap.pending)  # pending fragments are a suffix of the dispatch order
        gens = tuple(sorted((self.rel(e, now), g - first if g >= 0 else -1)
                            for e, g in snap.generators if e > now or g >= 0))
        idle = set(snap.idle)
        ranks = tuple(sorted(
            (0 if r in idle else max(1, self.rel(e, now)), tuple(g - first for g in grps), int(lg))
            for r, (e, grps, lg) in enumerate(snap.ranks)))
        return (pend_abs - first * F, self.P - first, gens, ranks, tuple(snap.ready))

    # ---- abstract dynamics -------------------------------------------------------------------------
    def leaf(self, st: State) -> int:
        """Ticks until the commit ends if no TAG is inserted from this state on (``no_tag_commit``; memoized)."""
        v = self._leaves.get(st)
        if v is None:
            if len(self._leaves) > MEMO_LIMIT:
                self._leaves.clear()
            v = self._leaves[st] = self._leaf(st)
        return v

    def _leaf(self, st: State) -> int:
        nxt, left, gens, ranks, ready = st
        F, gen = self.F, self.gen
        done: dict[int, int] = {}
        for e, g in gens:
            if g >= 0:
                done[g] = max(done.get(g, 0), e)
        for e, grps, _ in ranks:
            for g in grps:
                done[g] = max(done.get(g, 0), e)
        pending = [(g, gen[max(nxt - g * F, 0):]) for g in range(nxt // F, left)]  # group by group, dispatch order
        return no_tag_commit([e for e, _ in gens] + [0] * (self.n_gen - len(gens)), pending, done,
                             [e for e, _, _ in ranks], ready, self.chunk, self.commit, uniform=self._uniform)

    def idle_count(self, st: State) -> int:
        return sum(1 for e, g, _ in st[3] if e == 0 and not g)

    def pending_count(self, st: State) -> int:
        return st[1] * self.F - st[0]

    def advance(self, st: State, k: int) -> tuple[int, State | None]:
        """Insert k TAG fragments now, run to the next bubble. Returns (ticks elapsed, bubble state) or
        (ticks to the commit end, None) when the step ends without another bubble (memoized)."""
        key = (st, k)
        v = self._advanced.get(key)
        if v is None:
            if len(self._advanced) > MEMO_LIMIT:
                self._advanced.clear()
            v = self._advanced[key] = self._advance(st, k)
        return v

    def _advance(self, st: State, k: int) -> tuple[int, State | None]:
        nxt, left, gens0, ranks0, ready0 = st
        F, C, total, gen, chunk = self.F, self.C, left * self.F, self.gen, self.chunk
        out = Counter(i // F for i in range(nxt, total))  # group -> its fragments not generated yet
        out.update(g for _, g in gens0 if g >= 0)
        out.update(g for _, grps, _ in ranks0 for g in grps)
        gens, ranks = [list(x) for x in gens0], [list(x) for x in ranks0]
        ready = list(ready0)
        for _ in range(self.n_gen - len(gens)):  # idle generators take pending work first
            if nxt < total:
                gens.append([gen[nxt % F], nxt // F])
                nxt += 1
        idle = sorted((i for i, r in enumerate(ranks) if r[0] == 0 and not r[1]), key=lambda i: -ranks[i][2])
        for i in idle[:k]:
            if nxt >= total:
                break
            # a gang: up to one fragment per rank, of one or more groups (``plan.gang_groups``: else the head's)
            m = min(self.shard_ranks, total - nxt if self.gang_groups else F - nxt % F)
            grps = tuple(range(nxt // F, (nxt + m - 1) // F + 1))
            ranks[i] = [self.gang_ticks(nxt % F, m, bool(ranks[i][2])), grps, 1]
            for g in grps:  # the gang's fragments of a group end together: one completion for them
                out[g] -= min(nxt + m, (g + 1) * F) - max(nxt, g * F) - 1
            nxt += m
        t = 0
        while True:
            t_next = None
            for x in gens:
                if t_next is None or x[0] < t_next:
                    t_next = x[0]
            for x in ranks:
                if x[0] > t and (t_next is None or x[0] < t_next):
                    t_next = x[0]
            if t_next is None:  # nothing in flight: the step's work is done
                return max([t] + [x[0] for x in ranks]) + self.commit, None
            t = t_next
            keep = []
            for x in gens:
                if x[0] == t:
                    g = x[1]
                    if g >= 0:
                        out[g] -= 1
                        if out[g] == 0:
                            ready.append(C)
                    if nxt < total:
                        keep.append([t + gen[nxt % F], nxt // F])
                        nxt += 1
                else:
                    keep.append(x)
            gens = keep
            freed = []
            for x in ranks:
                if x[0] == t:
                    freed.append(x)
                    for g in x[1]:
                        out[g] -= 1
                        if out[g] == 0:
                            ready.append(C)
                    x[1] = ()
            for x in ranks:
                if x[0] <= t and ready:
                    rem = ready[0]
                    x[0], x[2] = t + chunk[C - rem], 0
                    if rem == 1:
                        ready.pop(0)
                    else:
                        ready[0] = rem - 1
            if nxt < total and any(x[0] == t for x in freed):
                return t, self._rebase(t, nxt, left, gens, ranks, ready, out)

    def _rebase(self, t, nxt, left, gens, ranks, ready, out) -> State:
        F = self.F
        first = min([g for g, n in out.items() if n > 0] + [left])
        gens_t = tuple(sorted((e - t, g - first if g >= 0 else -1) for e, g in gens))
        ranks_t = tuple(sorted((max(0, e - t), tuple(g - first for g in grps), lg) for e, grps, lg in ranks))
        return (nxt - first * F, left - first, gens_t, ranks_t, tuple(ready))
