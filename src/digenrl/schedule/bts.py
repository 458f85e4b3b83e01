"""BTS: recursive bubble-triggered TAG search (docs/architecture.md, "BTS").

Called by the scheduler only when a trainer rank is about to idle (no ready chunk, empty TAG queue) while
fragments of the current step are still pending. Branches: ``SkipBubble`` (k = 0) or ``InsertTAG(k)``: the
next k pending fragments go to k idle ranks. Value of a branch = predicted end of the step's commit:

    V_0(s) = commit end if no TAG is ever inserted from s            (two list schedules, ``TickModel.leaf``)
    V_d(s) = min_k [ elapsed(s, k) + V_{d-1}(next bubble after s, k) ]  (``TickModel.advance``)

memoized on the compressed ``State`` (relative, quantized, renumbered: see ``bts_model``), with a depth bound
and a budget. Candidates are k in {0..m} (m = min(idle ranks, pending)), thinned to {0, 1, 2, 4, ..., m} when
m exceeds ``max_branch``; k = 0 is always one. Ties (equal predicted commit, in ticks) go to the larger k: it
finishes the step's rollout earlier, which frees the generators for the next step's work (TCSS stale
fragments, or simply an earlier start after the publish), a gain the step-k objective does not see (with
several minibatches per step, whose intermediate commits the prediction ignores, ties go to k = 0);
``ties_to_larger_k=False``: ties to the smaller k (``benchmarks/bts_quality.py`` compares both).

Budget (deterministic): a decision may evaluate at most ``budget_nodes`` search nodes, one node being one call
of the abstract dynamics (``TickModel.advance`` or ``TickModel.leaf``; memo hits are free). The search deepens
iteratively, depth 0, 1, ..., ``depth``, and when the budget runs out inside depth d the complete ranking of
depth d - 1 decides (budget hit, counted); only when not even depth 0 completes is the decision SkipBubble. So
the same snapshots (and the same memo, i.e. the same earlier decisions) always give the same decision,
whatever the machine's load. ``budget_s`` is an optional wall-clock safety cap on top (None by default: a
decision's cost is bounded by the node budget times the cost of simulating one step's events); when set, a
decision's outcome may depend on load again.

Safety (why ``gap_tsp_tag`` is never slower than ``gap_tsp`` with exact costs): the chosen k must satisfy
``predict_commit(k) <= predict_commit(0)`` in exact arithmetic (``StepModel.predict_commit``, the same floats as
the simulator). The no-TAG continuation of the state after each decision then never gets later, and with no
TAG at all the step is exactly the ``gap_tsp`` step; the first candidate of the search order that passes is
taken, else SkipBubble. With several minibatch rounds per step, BTS decides only in round 0, the candidates
are round 0's pending fragments, and the check compares the end of round 0's commit (the later rounds start
after it and train groups whose generation TAG only ever makes earlier).

The clock (default ``time.perf_counter``) only measures search times for the statistics and, when
``budget_s`` is set, the wall-clock cap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from .bts_model import Snapshot, State, StepModel, TickModel
from .cost import CostModel, Durations
from .plan import StepPlan


TAG_POLICIES = ("auto", "bts", "greedy", "none")
MEMO_LIMIT = 200_000  # the memo is cleared when it grows past this many entries


@dataclass(frozen=True)
class BTSConfig:
    depth: int = 2            # recursion depth over future bubbles (0: compare the branches by V_0 only)
    budget_nodes: int = 2_000  # per-decision search nodes (advance/leaf evaluations); over it -> shallower result
    budget_s: float | None = None  # optional wall-clock cap per decision (None: none; decisions then load-free)
    policy: str = "auto"      # TAG decision policy: "auto" | "bts" | "greedy" (k = min(idle, pending)) | "none" (k = 0)
    ties_to_larger_k: bool = True  # equal predicted commits: the larger k (False: the smaller)
    max_branch: int = 4       # candidates k = 0..m when m <= max_branch, else {0, 1, 2, 4, ..., m}
    online: bool = True       # refine the cost model from the run's own action times (``online_cost``)
    online_decay: float = 0.5  # weight of a step's observations one step later (0: the last step only)

    def __post_init__(self) -> None:
        for name, ok, rule in (("depth", self.depth >= 0, ">= 0"), ("budget_nodes", self.budget_nodes >= 1, ">= 1"),
                               ("budget_s", self.budget_s is None or self.budget_s > 0, "> 0 or None"),
                               ("policy", self.policy in TAG_POLICIES, f"one of {', '.join(TAG_POLICIES)}"),
                               ("max_branch", self.max_branch >= 1, ">= 1"),
                               ("online_decay", 0.0 <= self.online_decay < 1.0, "in [0, 1)")):
            if not ok:
                raise ValueError(f"{name}: must be {rule} (got {getattr(self, name)!r})")


@dataclass(frozen=True)
class Decision:
    k: int                    # fragments to insert (0 = SkipBubble); its search time and prediction: ``BTSStats``
    nodes: int = 0            # search nodes evaluated
    depth: int = -1           # deepest complete search level (-1: none, SkipBubble by budget)


@dataclass
class BTSStats:
    """Decision statistics. Prediction error of a step (its first decision at ``now``, predicted commit end
    ``pred``, realized end ``real``): against the predicted span, |real - pred| / (pred - now) (``span_*``),
    and against the absolute time, |real - pred| / real (``makespan_rel_error_mean``, which shrinks as the run
    goes on and so understates the error)."""

    decisions: int = 0
    inserted: int = 0         # TAG fragments inserted
    memo_hits: int = 0
    memo_lookups: int = 0
    budget_hits: int = 0      # decisions whose configured depth did not complete within the budget
    skip_fallbacks: int = 0   # of those, decisions where not even depth 0 completed (SkipBubble)
    nodes: int = 0            # search nodes evaluated, all decisions
    nodes_max: int = 0        # most nodes of one decision
    vetoed: int = 0           # best searched branch rejected by the exact safety check
    search_s: list[float] = field(default_factory=list)
    predicted: dict[int, float] = field(default_factory=dict)  # step -> predicted commit at its first bubble
    decided_at: dict[int, float] = field(default_factory=dict)  # step -> time of that first bubble
    realized: dict[int, float] = field(default_factory=dict)   # step -> realized commit end

    @property
    def memo_hit_rate(self) -> float:
        return self.memo_hits / self.memo_lookups if self.memo_lookups else 0.0

    def span_errors(self) -> list[float]:
        """Signed (real - pred) / (pred - now) per step with a prediction and a realized commit."""
        out = []
        for s, pred in sorted(self.predicted.items()):
            if s in self.realized and pred == pred:
                span = pred - self.decided_at[s]
                out.append((self.realized[s] - pred) / max(span, 1e-12))
        return out

    def summary(self) -> dict[str, float]:
        times = sorted(self.search_s)
        errs = [abs(self.predicted[s] - self.realized[s]) / max(self.realized[s], 1e-12)
                for s in self.predicted if s in self.realized and self.predicted[s] == self.predicted[s]]
        span = self.span_errors()
        return {
            "decisions": self.decisions, "inserted": self.inserted, "memo_hit_rate": self.memo_hit_rate,
            "budget_hits": self.budget_hits, "skip_fallbacks": self.skip_fallbacks, "vetoed": self.vetoed,
            "nodes": self.nodes, "nodes_max": self.nodes_max, "nodes_per_decision": self.nodes / self.decisions if self.decisions else 0.0,
            "search_total_s": sum(times), "search_median_s": times[len(times) // 2] if times else 0.0,
            "search_max_s": times[-1] if times else 0.0,
            "makespan_rel_error_mean": sum(errs) / len(errs) if errs else 0.0,
            "span_rel_error_mean": sum(abs(e) for e in span) / len(span) if span else 0.0,
            "span_rel_error_max": max((abs(e) for e in span), default=0.0),
            "span_rel_bias": sum(span) / len(span) if span else 0.0,
            "predictions": len(span),
        }

    def record(self, snap: Snapshot, k: int, predicted: float, elapsed: float) -> None:
        self.decisions += 1
        self.inserted += k
        self.search_s.append(elapsed)
        if snap.step not in self.predicted and predicted == predicted:
            self.predicted[snap.step] = predicted
            self.decided_at[snap.step] = snap.now


class _OverBudget(Exception):
    pass


class BTS:
    """Bubble-triggered TAG search for one plan and one cost model."""

    def __init__(self, plan: StepPlan, cost: CostModel, config: BTSConfig | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.config = config or BTSConfig()
        self.clock = clock
        self.model = StepModel(plan, Durations(plan, cost))
        d = self.model.dur  # the tick of the compressed state: 1/4 of the shortest fragment or chunk
        shortest = min([d.generate(s, False, False) for s in self.model.frag_sizes]
                       + [d.train(c) for c in self.model.chunk_sizes])
        self.ticks = TickModel(self.model, max(shortest / 4.0, 1e-9))
        # several minibatch commits per step: the prediction ignores the intermediate commits (a TAG fragment in
        # flight delays one), so an equal prediction is no evidence that inserting is free: ties to k = 0
        self._larger_ties = self.config.ties_to_larger_k and plan.rounds == 1
        self.stats = BTSStats()
        self._memo: dict[tuple[State, int], int] = {}
        self._deadline: float | None = None
        self._nodes = 0

    # ---- public ------------------------------------------------------------------------------------
    def decide(self, snap: Snapshot) -> Decision:
        t0 = self.clock()
        cap = self.config.budget_s
        self._deadline = None if cap is None else t0 + cap
        self._nodes = 0
        tm = self.ticks
        st = tm.compress(snap)
        pending = snap.pending if self.model.round0 is None else [f for f in snap.pending if f[0] in self.model.round0]
        m = min(len(snap.idle), len(pending))  # (several rounds: the scheduler only inserts round 0's fragments)
        ranked, reached = None, -1
        for d in range(self.config.depth + 1):  # iterative deepening: the deepest complete ranking decides
            try:
                ranked, reached = self._ranked(st, d, m), d
            except _OverBudget:
                break
        k, value = 0, None
        if ranked is not None:
            base = self.model.predict_commit(snap, 0)
            for v, cand in ranked:
                if cand == 0:
                    break
                if self.model.predict_commit(snap, cand) <= base:
                    k = cand
                    break
                self.stats.vetoed += 1
            value = next(v for v, c in ranked if c == k)
        s = self.stats
        if reached < self.config.depth:
            s.budget_hits += 1
            s.skip_fallbacks += ranked is None
        s.nodes += self._nodes
        s.nodes_max = max(s.nodes_max, self._nodes)
        elapsed = self.clock() - t0
        predicted = snap.now + (value * tm.q if value is not None else float("nan"))
        s.record(snap, k, predicted, elapsed)
        if len(self._memo) > MEMO_LIMIT:
            self._memo.clear()
        return Decision(k, self._nodes, reached)

    def set_cost(self, cost: CostModel) -> None:
        """Predict with ``cost`` from now on (online refinement, between steps). The tick keeps its length; the
        memo, whose values were priced by the old model, is cleared."""
        plan = self.model.plan
        self.model = StepModel(plan, Durations(plan, cost))
        self.ticks = TickModel(self.model, self.ticks.q)
        self._memo.clear()

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
        tm = self.ticks
        m = min(tm.idle_count(st), tm.pending_count(st))
        if depth == 0 or m == 0:
            self._spend()
            v = tm.leaf(st)
        else:
            v = self._ranked(st, depth, m)[0][0]
        self._memo[key] = v
        return v

    # ---- internals ---------------------------------------------------------------------------------
    def _spend(self) -> None:
        """Charge one search node; over the node budget (or the optional wall-clock cap): stop the search."""
        self._nodes += 1
        if self._nodes > self.config.budget_nodes:
            raise _OverBudget
        if self._deadline is not None and self.clock() > self._deadline:
            raise _OverBudget

    def _ranked(self, st: State, depth: int, m: int) -> list[tuple[int, int]]:
        """(value, k) of every candidate, best first (ties: larger k unless ``ties_to_larger_k`` is off)."""
        tm = self.ticks
        out = []
        for k in self.candidates(m):
            if depth == 0:
                if k:
                    self._spend()
                    dt, nxt = tm.advance(st, k)
                else:
                    dt, nxt = 0, st
                if nxt is not None:
                    self._spend()
                v = dt + tm.leaf(nxt) if nxt is not None else dt
            else:
                self._spend()
                dt, nxt = tm.advance(st, k)
                v = dt if nxt is None else dt + self.value(nxt, depth - 1)
            out.append((v, k))
        sign = -1 if self._larger_ties else 1
        out.sort(key=lambda x: (x[0], sign * x[1]))
        return out
