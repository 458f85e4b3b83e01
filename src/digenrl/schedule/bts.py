"""BTS: recursive bubble-triggered TAG search (docs/architecture.md, "BTS").

Called by the scheduler only when a trainer rank is about to idle (no ready chunk, empty TAG queue) while
fragments of the current step are still pending. Branches: ``SkipBubble`` (k = 0) or ``InsertTAG(k)``: the
next k pending fragments go to k idle ranks. Value of a branch = predicted end of the step's commit:

    V_0(s) = commit end if no TAG is ever inserted from s            (two list schedules, ``TickModel.leaf``)
    V_d(s) = min_k [ elapsed(s, k) + V_{d-1}(next bubble after s, k) ]  (``TickModel.advance``)

memoized on the compressed ``State`` (relative, quantized, renumbered: see ``bts_model``), with a depth bound
and a time budget (over budget: SkipBubble). Candidates are k in {0..m} (m = min(idle ranks, pending)), thinned
to {0, 1, 2, 4, ..., m} when m exceeds ``max_branch``; k = 0 is always one.

Safety (why ``gap_tsp_tag`` is never slower than ``gap_tsp`` with exact costs): the chosen k must satisfy
``predict_commit(k) <= predict_commit(0)`` in exact arithmetic (``StepModel.predict_commit``, the same floats as
the simulator). The no-TAG continuation of the state after each decision then never gets later, and with no
TAG at all the step is exactly the ``gap_tsp`` step; the first candidate of the search order that passes is
taken, else SkipBubble.

The budget clock is ``clock`` (default ``time.perf_counter``); it is only used for budget accounting and
statistics, so decisions are deterministic whenever the budget is not hit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from .bts_model import Snapshot, State, StepModel, TickModel
from .cost import CostModel, Durations
from .plan import StepPlan


@dataclass(frozen=True)
class BTSConfig:
    depth: int = 2            # recursion depth over future bubbles (0: compare the branches by V_0 only)
    budget_s: float = 0.05    # per-decision search budget; over it -> SkipBubble
    max_branch: int = 4       # candidates k = 0..m when m <= max_branch, else {0, 1, 2, 4, ..., m}
    quantum_s: float | None = None  # tick of the compressed state; None: 1/4 of the shortest fragment/chunk
    memo_limit: int = 200_000  # the memo is cleared when it grows past this many entries

    def __post_init__(self) -> None:
        if self.depth < 0:
            raise ValueError(f"depth: must be >= 0 (got {self.depth})")
        if not self.budget_s > 0:
            raise ValueError(f"budget_s: must be > 0 (got {self.budget_s})")
        if self.max_branch < 1:
            raise ValueError(f"max_branch: must be >= 1 (got {self.max_branch})")


@dataclass(frozen=True)
class Decision:
    k: int                    # fragments to insert (0 = SkipBubble)
    predicted_commit: float   # absolute predicted end of the step's commit (search value)
    search_s: float           # time spent deciding


@dataclass
class BTSStats:
    decisions: int = 0
    inserted: int = 0         # TAG fragments inserted
    memo_hits: int = 0
    memo_lookups: int = 0
    budget_hits: int = 0
    vetoed: int = 0           # best searched branch rejected by the exact safety check
    search_s: list[float] = field(default_factory=list)
    predicted: dict[int, float] = field(default_factory=dict)  # step -> predicted commit at its first bubble
    realized: dict[int, float] = field(default_factory=dict)   # step -> realized commit end

    @property
    def memo_hit_rate(self) -> float:
        return self.memo_hits / self.memo_lookups if self.memo_lookups else 0.0

    def summary(self) -> dict[str, float]:
        times = sorted(self.search_s)
        errs = [abs(self.predicted[s] - self.realized[s]) / max(self.realized[s], 1e-12)
                for s in self.predicted if s in self.realized]
        return {
            "decisions": self.decisions, "inserted": self.inserted, "memo_hit_rate": self.memo_hit_rate,
            "budget_hits": self.budget_hits, "vetoed": self.vetoed,
            "search_total_s": sum(times), "search_median_s": times[len(times) // 2] if times else 0.0,
            "search_max_s": times[-1] if times else 0.0,
            "makespan_rel_error_mean": sum(errs) / len(errs) if errs else 0.0,
        }


class _OverBudget(Exception):
    pass


class BTS:
    """Bubble-triggered TAG search for one plan and one cost model."""

    def __init__(self, plan: StepPlan, cost: CostModel, config: BTSConfig | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.config = config or BTSConfig()
        self.clock = clock
        self.model = StepModel(plan, Durations(plan, cost))
        q = self.config.quantum_s
        if q is None:
            d = self.model.dur
            shortest = min([d.generate(s, False, False) for s in self.model.frag_sizes]
                           + [d.train(c) for c in self.model.chunk_sizes])
            q = max(shortest / 4.0, 1e-9)
        self.ticks = TickModel(self.model, q)
        self.stats = BTSStats()
        self._memo: dict[tuple[State, int], int] = {}
        self._deadline = 0.0

    # ---- public ------------------------------------------------------------------------------------
    def decide(self, snap: Snapshot) -> Decision:
        t0 = self.clock()
        self._deadline = t0 + self.config.budget_s
        tm = self.ticks
        st = tm.compress(snap)
        m = min(len(snap.idle), len(snap.pending))
        k, value = 0, None
        try:
            ranked = self._ranked(st, self.config.depth, m)
            value = ranked[0][0]
            base = self.model.predict_commit(snap, 0)
            for v, cand in ranked:
                if cand == 0:
                    break
                if self.model.predict_commit(snap, cand) <= base:
                    k = cand
                    break
                self.stats.vetoed += 1
            value = next(v for v, c in ranked if c == k)
        except _OverBudget:
            self.stats.budget_hits += 1
            k = 0
        elapsed = self.clock() - t0
        predicted = snap.now + (value * tm.q if value is not None else float("nan"))
        s = self.stats
        s.decisions += 1
        s.inserted += k
        s.search_s.append(elapsed)
        if snap.step not in s.predicted and value is not None:
            s.predicted[snap.step] = predicted
        if len(self._memo) > self.config.memo_limit:
            self._memo.clear()
        return Decision(k, predicted, elapsed)

    def record_commit(self, step: int, time_s: float) -> None:
        self.stats.realized[step] = time_s

    def candidates(self, m: int) -> list[int]:
        if m <= self.config.max_branch:
            return list(range(m + 1))
        out, k = [0, 1], 2
        while k < m:
            out.append(k)
            k *= 2
        return out + [m]

    def value(self, st: State, depth: int) -> int:
        """V_depth(st) in ticks relative to the state's now (memoized)."""
        key = (st, depth)
        self.stats.memo_lookups += 1
        v = self._memo.get(key)
        if v is not None:
            self.stats.memo_hits += 1
            return v
        if self.clock() > self._deadline:
            raise _OverBudget
        tm = self.ticks
        m = min(tm.idle_count(st), tm.pending_count(st))
        if depth == 0 or m == 0:
            v = tm.leaf(st)
        else:
            v = self._ranked(st, depth, m)[0][0]
        self._memo[key] = v
        return v

    # ---- internals ---------------------------------------------------------------------------------
    def _ranked(self, st: State, depth: int, m: int) -> list[tuple[int, int]]:
        """(value, k) of every candidate, best first (ties: smaller k)."""
        tm = self.ticks
        out = []
        for k in self.candidates(m):
            if depth == 0:
                dt, nxt = tm.advance(st, k) if k else (0, st)
                v = dt + tm.leaf(nxt) if nxt is not None else dt
            else:
                dt, nxt = tm.advance(st, k)
                v = dt if nxt is None else dt + self.value(nxt, depth - 1)
            out.append((v, k))
        out.sort()
        return out
