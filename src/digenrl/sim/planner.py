"""The one planner of ``digenrl simulate`` and ``digenrl plan``: the fastest way to run one mode on W GPUs, searched
in virtual time.

What it searches (``Candidate``), per generator/trainer split of the GPUs (``Split``; on a heterogeneous testbed
also which GPU kind hosts which pool; colocated: the W workers, or a homogeneous part of them):

* fragment size f (a divisor of G that a generator's memory holds);
* TCSS stale cap (``full``, where the source leaves it open: ``digenrl plan``; 0, 0.25, 0.5);
* shard groups k (a sharded trainer pool under TSP: k <= ``MAX_SHARD_GROUPS`` groups of at least 2 ranks);
* TAG inference copy (TAG on a shard group) and gang width (TAG on a shard group of several lanes);
* publish path (disaggregated; outside TCSS the generators are idle at every final commit, so only the path of
  the shortest span from the commit's end to the generators holding the version is tried; in ``full`` all);
* sequence-parallel degree of the trainer lanes and of the generators (families with a plan: a divisor of the
  heads and of the latent tokens, inside one node, that divides the ranks it groups);
* and, on the chosen plan, the stale hold (``full`` with a joined publish: 0 and ``STALE_HOLDS``).

The chunk shape is not an axis: one rule picks it for every candidate, ``schedule.layout.choose_chunk_shape`` over
the group's actual tiles, priced by the candidate's own cost model, at most the chunk its memory plan holds (the
same rule as ``train.chunk_cells: auto``, which prices a chunk by its per-rank cells). Which values each axis
may take, and how a candidate becomes a cost model and a ``StepPlan``, is the source's (``sim.scenario`` for a
model/testbed preset, ``sim.from_config`` for a run config); the search is this module's, the same for both.

Search: per split, every combination of the axes when there are at most ``exhaustive`` (probed lowest floor
first); else the split is probed once at the source's own values (``Source.start``) and the ``descend_splits``
fastest splits get a coordinate descent from there: every axis in turn, the split itself among them (all
splits at the current values), twice. Then the neighbouring splits (g +- 1) of the best, at its values, until
none is faster. A probe is the candidate's plan simulated for ``probe_steps`` steps; its figure is the steady
step time (first publish to last, over steps - 1 intervals: no pipeline fill, ``sim.executor.steady_step_time``).
In ``full`` a probe runs at least ``FULL_PROBE_STEPS`` steps: TCSS's next-step fragments move the step time over
the first steps (FLUX on 32 H100s, split 8+24: fragment 8 probes 39.26 s at 4 steps, fragment 4 39.25 s, but at
20 steps they run 43.0 s and 38.8 s; at 8 steps already 41.4 s and 38.7 s).
Ties go to the earlier probe. Pruning (exact): a candidate whose step-time floor (``sim.plan_bound``, never above
its simulated figure) is above the best of its split (exhaustive) or of its sweep so far is strictly slower than
a probe already run and is not simulated; a probe is stopped as soon as its run passes that best. The plan,
its time and every split's best are those of the unpruned search (``prune=False``); only the probe count drops.

After the search, the pick at the run's length and the stale hold: ``sim.run_pick``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Callable, Protocol

from ..schedule import Durations, Mode, StepPlan
from .executor import run_step_time, steady_step_time
from .plan_bound import Priced, run_step_floor, step_time_floor
from .presets import GPU
from .run_pick import STALE_HOLDS, at_run_length, choose_stale_hold

MAX_SHARD_GROUPS = 6  # hybrid sharding: k <= 6 shard groups (benchmarks/hybrid_sharding.py: k = 2-6)
STALE_CAPS = (0.0, 0.25, 0.5)
FULL_PROBE_STEPS = 8  # the shortest probe in ``full`` (module docstring)
AXES = ("fragment_size", "max_stale_fraction", "shard_groups", "tag_copy", "publish", "gang_groups",
        "sequence_parallel", "generator_sequence_parallel")


class Infeasible(ValueError):
    """A candidate that cannot run (memory, group sizes, a profile without the pool size); says why."""


class PlanSearchError(ValueError):
    """Nothing can be planned; names the option. ``refused``: split label -> why it could not be priced."""

    def __init__(self, message: str, refused: dict[str, str] | None = None):
        super().__init__(message)
        self.refused = dict(refused or {})


@dataclass(frozen=True)
class Split:
    """GPUs of the generator pool (0: colocated) and trainer ranks, and the GPU kind of each pool."""

    n_gen: int
    n_train: int
    gen_gpu: GPU | None = None
    train_gpu: GPU | None = None

    def key(self) -> str:
        return f"{self.n_train} coloc" if self.n_gen == 0 else f"{self.n_gen}+{self.n_train}"

    def label(self, heterogeneous: bool) -> str:
        if not heterogeneous:
            return ""
        if self.n_gen == 0:
            return f"colocated on {self.n_train} x {self.train_gpu.name}"
        return f"gen {self.gen_gpu.name}, trn {self.train_gpu.name}"


@dataclass(frozen=True)
class Candidate:
    """One way to run the mode: a split and the value of every axis (module docstring)."""

    split: Split
    fragment_size: int
    max_stale_fraction: float = 0.0
    shard_groups: int = 1
    tag_copy: bool = False
    publish: str = "object_store"
    gang_groups: bool = True
    sequence_parallel: int = 1
    generator_sequence_parallel: int = 1
    stale_hold: float = 0.0

    @property
    def generators(self) -> int:
        """Generator ids (each of ``generator_sequence_parallel`` GPUs)."""
        return self.split.n_gen // self.generator_sequence_parallel

    def label(self, plan: StepPlan | None = None) -> str:
        """``3+5, fragment 4, chunk 24x2, stale cap 0.25, 2 shard groups, publish stream, ...``. A packed colocated
        plan names what a worker (a rank, or a lane of ranks) samples in one action, not its fragment size
        (``8 coloc, packed 144 per worker, chunk 24x2``); the stale cap is named only where TCSS uses it (without a
        plan: where it is above 0)."""
        packed = plan is not None and plan.packed
        tcss = plan.mode.tcss if plan is not None else self.max_stale_fraction > 0
        words = [self.split.key(),
                 f"packed {plan.colocated_share * self.fragment_size} per worker" if packed
                 else f"fragment {self.fragment_size}",
                 plan is not None and f"chunk {plan.chunk_generations}x{plan.chunk_timesteps}",
                 tcss and f"stale cap {self.max_stale_fraction:g}",
                 self.shard_groups > 1 and f"{self.shard_groups} shard groups",
                 self.split.n_gen and f"publish {self.publish}",
                 self.stale_hold and f"stale hold {self.stale_hold:g}",
                 self.tag_copy and "TAG inference copy",
                 not self.gang_groups and "gangs of the head group",
                 self.sequence_parallel > 1 and f"sequence parallel {self.sequence_parallel}",
                 self.generator_sequence_parallel > 1 and f"generators of {self.generator_sequence_parallel} GPUs"]
        return ", ".join(w for w in words if w)


class Source(Protocol):
    """Where the candidates come from and how each is priced (``sim.scenario``, ``sim.from_config``)."""

    mode: Mode
    workers: int
    bts: object

    def splits(self) -> list[Split]: ...

    def start(self, split: Split) -> Candidate: ...

    def values(self, split: Split, axis: str) -> list: ...

    def build(self, c: Candidate) -> tuple[object, StepPlan]: ...


@dataclass
class Probe:
    candidate: Candidate
    plan: StepPlan
    step_time: float
    order: int = 0


@dataclass
class SearchResult:
    mode: Mode
    workers: int
    best: Probe
    probes: list[Probe]
    refused: dict[str, str] = field(default_factory=dict)  # split -> why none of its candidates can be priced
    pruned: int = 0
    holds_s: dict = field(default_factory=dict)            # stale hold -> the chosen plan's time with it
    costs: dict = field(default_factory=dict)              # candidate -> its cost model (probed ones)
    run_steps: int | None = None                           # the run's length the pick was made at (None: probes)
    runs_s: dict = field(default_factory=dict)             # candidate -> makespan / K at run_steps (simulated ones)
    runs_skipped: int = 0                                  # candidates of the final pick skipped by floor or cap

    def best_per_split(self) -> dict[str, Probe]:
        """split -> its fastest probe (ties: the earlier)."""
        out: dict[str, Probe] = {}
        for p in self.probes:
            k = p.candidate.split.key()
            if k not in out or _rank(p) < _rank(out[k]):
                out[k] = p
        return out

    def per_split(self) -> dict[str, float]:
        return {k: p.step_time for k, p in self.best_per_split().items()}


def _rank(p: Probe) -> tuple[float, int]:
    return p.step_time, p.order


class _Search:
    def __init__(self, source: Source, probe_steps: int, prune: bool, progress):
        self.src, self.steps, self.prune, self.progress = source, probe_steps, prune, progress
        self.built: dict[Candidate, tuple | str] = {}   # candidate -> (cost, plan, floor) or why it cannot run
        self.seen: dict[Candidate, Probe | None] = {}
        self.order: dict[Candidate, int] = {}
        self.probes: list[Probe] = []
        self.pruned = 0
        self.runs: dict[Candidate, float] = {}          # candidate -> makespan / K at the run's length
        self.runs_skipped = 0
        self.floors: dict[Candidate, float] = {}        # candidate -> its run floor (one run length per search)
        self.priced: dict[Candidate, Priced] = {}        # candidate -> what both its floors read (any length)

    def _priced(self, c: Candidate, plan: StepPlan, cost) -> Priced:
        if c not in self.priced:
            self.priced[c] = Priced(plan, Durations(plan, cost))
        return self.priced[c]

    def run_floor(self, c: Candidate, steps: int) -> float:
        """``sim.plan_bound.run_step_floor`` of ``c``'s plan at ``steps`` steps (cached)."""
        if c not in self.floors:
            cost, plan, _ = self.get(c)
            self.floors[c] = run_step_floor(replace(plan, steps=steps), cost, priced=self._priced(c, plan, cost))
        return self.floors[c]

    def run(self, c: Candidate, steps: int, above: float = float("inf")) -> float | None:
        """makespan / K of ``c`` simulated for K = ``steps`` (``sim.run_pick``); None when it cannot run, or (not
        cached) when it is strictly slower than ``above`` (its run floor, or its run, passed it)."""
        if c in self.runs:
            return self.runs[c]
        b = self.get(c)
        if isinstance(b, str):
            return None
        cost, plan, _ = b
        plan = replace(plan, steps=steps)
        if self.prune and above < float("inf"):
            if self.run_floor(c, steps) > above:
                self.runs_skipped += 1
                return None
        t = run_step_time(plan, cost, bts=self.src.bts, above=above if self.prune else float("inf"))
        if t is None:
            self.runs_skipped += 1
            return None
        self.runs[c] = t
        return t

    def get(self, c: Candidate):
        if c not in self.built:
            try:
                cost, plan = self.src.build(c)
                plan = replace(plan, steps=self.steps)
                floor = step_time_floor(plan, cost, priced=self._priced(c, plan, cost)) if self.prune else 0.0
                self.built[c] = (cost, plan, floor)
            except Infeasible as e:
                self.built[c] = str(e)
        return self.built[c]

    def tell(self, c: Candidate) -> None:
        if self.progress is not None and self.probes:
            self.progress(len(self.probes), c.split.key(), min(q.step_time for q in self.probes), self.pruned)

    def probe(self, c: Candidate, above: float = float("inf")) -> Probe | None:
        """The probe of ``c``; None when it cannot run, or (not cached) when it is strictly slower than
        ``above`` (its floor, or its run, passed it)."""
        self.order.setdefault(c, len(self.order))
        if c in self.seen:
            return self.seen[c]
        b = self.get(c)
        if isinstance(b, str):
            self.seen[c] = None
            return None
        cost, plan, floor = b
        t = None if floor > above else steady_step_time(plan, cost, bts=self.src.bts,
                                                          above=above if self.prune else float("inf"))
        if t is None:
            self.pruned += 1
            self.tell(c)
            return None
        p = Probe(c, plan, t, self.order[c])
        self.probes.append(p)
        self.seen[c] = p
        self.tell(c)
        return p

    def sweep(self, cands: list[Candidate], above: float = float("inf")) -> Probe | None:
        """The fastest of ``cands`` (lowest floor first, each bounded by the best so far)."""
        for c in cands:
            self.order.setdefault(c, len(self.order))
        ranked = []
        for i, c in enumerate(cands):
            b = self.get(c)
            if not isinstance(b, str):
                ranked.append((b[2], i, c))
        best = None
        for _, _, c in sorted(ranked, key=lambda r: r[:2]):
            p = self.probe(c, above if best is None else min(above, best.step_time))
            if p is not None and (best is None or _rank(p) < _rank(best)):
                best = p
        return best


def _product(src: Source, split: Split) -> list[Candidate]:
    start = src.start(split)
    axes = {a: src.values(split, a) for a in AXES}
    return [replace(start, **dict(zip(AXES, vals))) for vals in itertools.product(*(axes[a] for a in AXES))]


def check_probe_steps(probe_steps: int) -> None:
    """Refuse probes too short for a stable steady step time (``digenrl plan`` checks it before loading anything)."""
    if probe_steps < 4:
        raise PlanSearchError(f"--probe-steps: must be >= 4 for a stable steady step time (got {probe_steps})")


def search(source: Source, *, probe_steps: int = 4, exhaustive: int = 64, descend_splits: int = 3,
           prune: bool = True, progress: Callable | None = None, run_steps: int | None = None) -> SearchResult:
    """The fastest candidate of ``source`` (module docstring). ``progress(probes, split, best, skipped)`` is called
    after every probe and every skipped candidate. ``run_steps``: the length of the run the plan is for; the pick
    is then the least makespan / K over that many steps among the candidates looked at (``sim.run_pick``)."""
    check_probe_steps(probe_steps)
    if run_steps is not None and run_steps < 1:
        raise PlanSearchError(f"run_steps: must be >= 1 (got {run_steps})")
    if source.mode is Mode.FULL:
        probe_steps = max(probe_steps, FULL_PROBE_STEPS)
    s = _Search(source, probe_steps, prune, progress)
    splits, descend = source.splits(), []
    for split in splits:
        cands = _product(source, split)
        if len(cands) <= exhaustive:
            s.sweep(cands)
        else:
            best = s.probe(source.start(split))
            descend.append((best.step_time if best is not None else float("inf"), len(descend), split))
    for _, _, split in sorted(descend, key=lambda d: d[:2])[:descend_splits]:
        cur = source.start(split)
        for axis in list(AXES) + ["split"] + list(AXES):
            here = s.seen.get(cur)
            values = splits if axis == "split" else source.values(cur.split, axis)
            cands = [replace(cur, split=v) if axis == "split" else replace(cur, **{axis: v}) for v in values]
            best = s.sweep(cands, here.step_time if here is not None else float("inf"))
            if best is not None and (here is None or _rank(best) < _rank(here)):
                cur = best.candidate
    by_gen = {sp.n_gen: sp for sp in splits}
    checked: set = set()
    while s.probes:  # the neighbouring splits of the best, at its values, while one is faster
        best = min(s.probes, key=_rank).candidate
        if best in checked:
            break
        checked.add(best)
        for g in (best.split.n_gen - 1, best.split.n_gen + 1):
            if best.split.n_gen > 0 and g in by_gen:
                s.probe(replace(best, split=by_gen[g]))
    probed = {p.candidate.split.key() for p in s.probes}
    refused = {}
    for split in splits:  # a split none of whose candidates ran: the reason of its own values' candidate
        if split.key() not in probed:
            reasons = [b for c in [source.start(split)] + _product(source, split)[:64]
                       if isinstance(b := s.get(c), str)]
            refused[split.key()] = reasons[0] if reasons else "slower than a probe already run at every value"
    if not s.probes:
        why = "; ".join(f"{k}: {v}" for k, v in refused.items()) or "no candidate fits"
        raise PlanSearchError(f"no plan of {source.mode.value} on {source.workers} GPUs can be priced ({why})",
                              refused)
    best = min(s.probes, key=_rank)
    if run_steps is not None:
        best = at_run_length(s, best, run_steps)
    res = SearchResult(source.mode, source.workers, best, sorted(s.probes, key=lambda p: p.order), refused,
                       s.pruned, costs={p.candidate: s.built[p.candidate][0] for p in s.probes}, run_steps=run_steps)
    choose_stale_hold(s, res)
    res.runs_s, res.runs_skipped = dict(s.runs), s.runs_skipped
    return res


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


__all__ = ["AXES", "Candidate", "FULL_PROBE_STEPS", "Infeasible", "MAX_SHARD_GROUPS", "PlanSearchError", "Probe", "STALE_CAPS",
           "STALE_HOLDS", "SearchResult", "Source", "Split", "check_probe_steps", "divisors", "search"]
