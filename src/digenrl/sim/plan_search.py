"""The plan search behind ``digenrl plan``: every generator/trainer split of W workers, fragment size, chunk
shape and stale cap of one mode, probed in virtual time; the fastest is the plan.

Candidates of a mode with W workers (``candidates_of_split``):

* split: (N_g, N_t) = (g, W - g) for g = 1 .. W - 1; ``colocated``: the W workers generate and train;
* fragment size f: every divisor of G;
* chunk shape (TSP modes): cg a divisor of G, cs a divisor of S, such that the memory plan fits
  (``train.memory.check_config`` with ``train.memory_gb``; no check when the config sets none);
* stale cap (``full`` only): {0, 0.25, 0.5}.

Per split the product is probed exhaustively when it has at most ``exhaustive`` members; else every split is
probed once at the config's own values and the ``descend_splits`` (3) fastest of them get a coordinate descent
from there (fragment, then chunk, then stale cap, then fragment again). A probe is
``plan_run`` of the candidate config (the plan ``digenrl train`` would execute; a colocated FSDP config is
planned with one worker per rank and priced as the idealised colocated FSDP bound, as ``digenrl simulate --config`` does:
``plan_for_pricing``) with ``steps`` = the probe length, simulated by ``sim.executor.steady_step_time``; its
figure is the steady step time (first publish to last, over steps - 1 intervals: no pipeline fill). The plan
is the probe with the smallest figure (ties: the earlier probe).

Pruning (exact): a candidate whose step-time floor (``sim.plan_bound``, never above its simulated figure) is
above the best of its split so far (exhaustive; probed lowest floor first) or of its descent sweep so far is
strictly slower than a probe already run, so it is not simulated; a probe run is stopped as soon as its
time since the first publish shows it strictly slower than that best (``steady_step_time(above=...)``). The plan, its step time, every split's best
and the robustness report are those of the unpruned search (``prune=False``); only the probe count drops.

A measured profile used at other pool sizes (``profile_costs``): per-worker op costs (denoise, VAE, reward,
transfer, train chunk, optimizer, TAG switch, publish) are kept: each worker does the same work at any pool
size, and the publish is taken to reach the generators in parallel. The gradient all-reduce depends on the
trainer count: it is used only at the trainer count the profile was measured with (its ``trainers`` key),
and is 0 with a single trainer (no collective); other trainer counts are refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from ..control.profile import ProfileCost
from ..schedule import CostModel, Mode
from ..schedule.cost import Op
from .executor import steady_step_time
from .plan_bound import step_time_floor

STALE_CAPS = (0.0, 0.25, 0.5)
GEN_OPS = {Op.DENOISE.value, Op.VAE_DECODE.value, Op.REWARD.value, Op.TRANSFER.value, Op.TAG_SWITCH.value}


class PlanSearchError(ValueError):
    """Nothing can be planned (no candidate fits, a profile without the pool size it needs); names the key.
    ``refused``: split label -> why it could not be priced (where the search refused every split)."""

    def __init__(self, message: str, refused: dict[str, str] | None = None):
        super().__init__(message)
        self.refused = dict(refused or {})


# why a split is refused when the config's shard groups do not divide its trainer ranks (``sim.plan_setting`` tells
# this reason from the others by its prefix: another split of the same value says what really stops it)
INDIVISIBLE = "train.shard_groups: {k} shard groups do not divide {n} trainer ranks"


@dataclass(frozen=True)
class Candidate:
    n_gen: int  # 0: colocated
    n_train: int
    fragment_size: int
    chunk: tuple[int, int]
    max_stale_fraction: float
    publish: str | None = None        # runtime.publish (None: the config's own; ``sim.plan_publish`` sets it)
    stale_hold: float | None = None   # runtime.stale_hold (None: the config's own)
    shard_groups: int | None = None   # train.shard_groups (None: the config's own; ``sim.plan_groups`` sets it)

    def label(self) -> str:
        pools = f"{self.n_train} coloc" if self.n_gen == 0 else f"{self.n_gen}+{self.n_train}"
        out = (f"{pools}, fragment {self.fragment_size}, chunk {self.chunk[0]}x{self.chunk[1]}, "
               f"stale cap {self.max_stale_fraction:g}")
        if self.shard_groups is not None:
            out += f", {self.shard_groups} shard group{'s' if self.shard_groups > 1 else ''}"
        if self.publish is not None:
            out += f", publish {self.publish}"
        if self.stale_hold:
            out += f", stale hold {self.stale_hold:g}"
        return out


@dataclass
class Probe:
    candidate: Candidate
    plan: object  # the StepPlan of the full run (steps of the config)
    step_time: float
    order: int = 0  # position in the search's probe order (ties between equal step times go to the earlier)


def _rank(p: Probe) -> tuple[float, int]:
    return p.step_time, p.order


@dataclass
class SearchResult:
    mode: str
    workers: int
    best: Probe
    probes: list[Probe]
    refused: dict[str, str] = field(default_factory=dict)  # split label -> reason
    robustness: dict = field(default_factory=dict)
    config: object = None  # the Config of the best plan
    colocated: Probe | None = None       # the colocated baseline on the same workers (``digenrl plan``)
    colocated_refused: str | None = None
    pruned: int = 0  # candidates skipped: their step-time floor was above a probe already run
    costs: dict = field(default_factory=dict)  # (n_gen, n_train) -> the cost model the split was priced with
    publish: dict = field(default_factory=dict)  # ``sim.plan_publish``: the paths and holds tried and their times
    groups: dict = field(default_factory=dict)   # ``sim.plan_groups``: the shard-group counts tried and their times


class ScaledCost:
    """``cost`` with rollout ops (denoise, VAE, reward, transfer, TAG switch) x ``gen`` and training ops
    (train chunk, all-reduce, optimizer, publish) x ``train``."""

    def __init__(self, cost: CostModel, gen: float, train: float):
        self.cost, self.gen, self.train = cost, gen, train

    def time(self, op: str, batch: int, pool: str) -> float:
        return self.cost.time(op, batch, pool) * (self.gen if op in GEN_OPS else self.train)


class SingleTrainerCost:
    """A profile at one trainer rank: the all-reduce is 0 (no collective), every other op as measured."""

    def __init__(self, cost: CostModel):
        self.cost = cost

    def time(self, op: str, batch: int, pool: str) -> float:
        return 0.0 if op == Op.ALLREDUCE.value else self.cost.time(op, batch, pool)


def profile_pools(path: str | Path) -> tuple[int | None, int | None]:
    """(generators, trainers) a profile JSON says it was measured with (None where it does not say)."""
    data = json.loads(Path(path).read_text())
    out = []
    for k in ("generators", "trainers"):
        v = data.get(k)
        out.append(int(v) if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else None)
    return out[0], out[1]


def profile_costs(profile: ProfileCost, measured_trainers: int | None):
    """``cost_of(n_gen, n_train)`` for a measured profile: the cost model, or a refusal reason (str)."""
    def cost_of(n_gen: int, n_train: int):
        if n_train == measured_trainers:
            return profile
        if n_train == 1:
            return SingleTrainerCost(profile)
        have = "has no 'trainers' key" if measured_trainers is None else f"was measured with {measured_trainers}"
        return (f"trainers: the profile {have}; its allreduce is unknown at {n_train} trainer ranks "
                f"(measure one with runtime.trainers={n_train})")
    return cost_of


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def splits_of(mode: Mode, workers: int) -> list[tuple[int, int]]:
    if mode is Mode.COLOCATED:
        return [(0, workers)]
    return [(g, workers - g) for g in range(1, workers)]


def apply(cfg, c: Candidate):
    """``cfg`` with the candidate's pools, fragment size, chunk shape and stale cap (chunk_cells explicit), and
    its publish path, stale hold and shard-group count where it names them."""
    rt = {"fragment_size": c.fragment_size, "max_stale_fraction": c.max_stale_fraction}
    rt.update({k: v for k, v in (("publish", c.publish), ("stale_hold", c.stale_hold)) if v is not None})
    rt.update({"generators": 1, "trainers": c.n_train} if c.n_gen == 0 else
              {"generators": c.n_gen, "trainers": c.n_train})
    tr = {"chunk_generations": c.chunk[0], "chunk_timesteps": c.chunk[1], "chunk_cells": None}
    if c.shard_groups is not None:
        tr["shard_groups"] = c.shard_groups
    return cfg.model_copy(update={"runtime": cfg.runtime.model_copy(update=rt),
                                  "train": cfg.train.model_copy(update=tr)})


def fitted(cfg, c: Candidate, fit: Callable | None):
    """``apply(cfg, c)`` adjusted to the hardware by ``fit`` (e.g. ``train.memory_gb``; None: as is): the config
    ``digenrl plan`` prices and writes for ``c``."""
    cc = apply(cfg, c)
    return fit(cc) if fit is not None else cc


def candidate_plan(cfg, c: Candidate, fit: Callable | None):
    """The plan of candidate ``c`` as ``digenrl plan`` prices it (``plan_for_pricing`` of ``fitted``), or None where
    the memory plan refuses the candidate."""
    cc = fitted(cfg, c, fit)
    return plan_for_pricing(cc)[0] if _fits(cc) else None


def _fits(cfg) -> bool:
    """The memory plan of ``digenrl train`` accepts ``cfg`` (trainer ranks and generators)."""
    from ..train.memory import MemoryPlanError, check_config, check_generators

    try:
        check_config(cfg)
        check_generators(cfg)
    except MemoryPlanError:
        return False
    return True


def plan_for_pricing(cfg):
    """(plan, trainer ranks, note): ``plan_run(cfg)``'s plan, in which a sharded pool (``train.sharding: fsdp``)
    is one shard group. A colocated sharded config is priced as the colocated FSDP baseline of the peers
    (``sim.colocation``: N ranks that each build an inference copy per step), planned with one scheduler
    worker per rank, and the row says so."""
    from ..control.run_plan import plan_run

    run = plan_run(cfg)
    if cfg.train.sharding != "fsdp" or run.plan.generators:
        return run.plan, len(run.trainer_ids), ""
    unsharded = cfg.model_copy(update={"train": cfg.train.model_copy(update={"sharding": "none"})})
    return plan_run(unsharded).plan, len(run.trainer_ids), "colocated FSDP priced as the idealised bound (inference copy)"


def search(cfg, workers: int, cost_of: Callable[[int, int], object], *, probe_steps: int = 4,
           exhaustive: int = 64, fit: Callable | None = None,
           progress: Callable[[int, str, float], None] | None = None, robust: bool = True,
           descend_splits: int = 3, prune: bool = True) -> SearchResult:
    """The fastest candidate of ``cfg.runtime.mode`` on ``workers`` workers (module docstring).

    ``cost_of(n_gen, n_train)`` returns a ``CostModel`` or a refusal reason; ``fit(cfg)`` adjusts a candidate
    config to the hardware (e.g. ``train.memory_gb``) before it is planned. ``progress(probes, split, best,
    skipped)`` is called after every probe and every skipped candidate (probes so far, the split of the candidate,
    the best step time so far, candidates skipped so far). ``prune``: skip
    candidates whose step-time floor (``sim.plan_bound``) shows they cannot win; False simulates every one (the
    same result, more probes)."""
    from ..control.run_plan import plan_run

    if probe_steps < 4:
        raise PlanSearchError(f"--probe-steps: must be >= 4 for a stable steady step time (got {probe_steps})")
    mode = Mode(cfg.runtime.mode)
    base_plan = plan_run(cfg)  # refuses what the runtime refuses (ConfigError) before any search
    G, S = base_plan.plan.generations, base_plan.trained_timesteps
    frags = divisors(G)
    chunks = [(cg, cs) for cg in divisors(G) for cs in divisors(S)] if mode.tsp else \
        [(cfg.train.chunk_generations, cfg.train.chunk_timesteps)]
    stales = list(STALE_CAPS) if mode is Mode.FULL else [cfg.runtime.max_stale_fraction]
    probes: list[Probe] = []
    refused: dict[str, str] = {}
    seen: dict[Candidate, Probe | None] = {}     # simulated (None: does not fit the memory plan)
    order: dict[Candidate, int] = {}             # position in the unpruned search's probe order
    priced_: dict[Candidate, tuple | None] = {}  # (plan, step-time floor), None: does not fit
    costs: dict[tuple[int, int], object] = {}
    pruned = [0]

    def priced(c: Candidate):
        if c not in priced_:
            plan = candidate_plan(cfg, c, fit)  # a colocated FSDP config: one worker per rank, as `simulate --config`
            priced_[c] = None
            if plan is not None:
                floor = step_time_floor(replace(plan, steps=probe_steps), costs[(c.n_gen, c.n_train)]) if prune \
                    else 0.0
                priced_[c] = (plan, floor)
        return priced_[c]

    def tell(c: Candidate) -> None:
        if progress is not None and probes:
            progress(len(probes), f"{c.n_gen}+{c.n_train}", min(q.step_time for q in probes), pruned[0])

    def probe(c: Candidate, above: float = float("inf")) -> Probe | None:
        """The probe of ``c``; None when it does not fit, or (not cached) when its floor is above ``above``: it is
        then strictly slower than a probe that was run, and is simulated only if asked for again without one."""
        order.setdefault(c, len(order))
        if c in seen:
            return seen[c]
        pc = priced(c)
        if pc is not None and pc[1] > above:
            pruned[0] += 1
            tell(c)
            return None
        p = None
        if pc is not None:
            plan = pc[0]
            t = steady_step_time(replace(plan, steps=probe_steps), costs[(c.n_gen, c.n_train)],
                                 above=above if prune else float("inf"))
            if t is None:  # the run passed ``above`` (strictly): stopped, as a floor above it would have
                pruned[0] += 1
                tell(c)
                return None
            p = Probe(c, plan, t, order[c])
            probes.append(p)
            tell(c)
        seen[c] = p
        return p

    start = (min(cfg.runtime.fragment_size, G) if G % cfg.runtime.fragment_size == 0 else 1,
             chunks[0] if (cfg.train.chunk_generations, cfg.train.chunk_timesteps) not in chunks
             else (cfg.train.chunk_generations, cfg.train.chunk_timesteps), stales[0])
    descend = []
    groups = cfg.train.shard_groups if cfg.train.sharding == "fsdp" else 1
    for g, t in splits_of(mode, workers):
        if t % groups:  # (the runtime refuses it: every shard group has the same number of ranks)
            refused[f"{g}+{t}"] = INDIVISIBLE.format(k=groups, n=t)
            continue
        cost = cost_of(g, t)
        if isinstance(cost, str):
            refused[f"{g}+{t}"] = cost
            continue
        costs[(g, t)] = cost
        if len(frags) * len(chunks) * len(stales) <= exhaustive:
            # every combination, probed lowest floor first; one whose floor is above the split's best so far
            # cannot be the split's best (nor the plan) and is skipped (``sim.plan_bound``)
            cands = [Candidate(g, t, f, ch, st) for f in frags for ch in chunks for st in stales]
            for c in cands:
                order.setdefault(c, len(order))
            ranked = sorted((pc[1], order[c], c) for c in cands if (pc := priced(c)) is not None)
            split_best = float("inf")
            for _, _, c in ranked:
                p = probe(c, split_best)
                if p is not None:
                    split_best = min(split_best, p.step_time)
            continue
        first = probe(Candidate(g, t, *start))  # every split once at the config's own values ...
        descend.append((first.step_time if first is not None else float("inf"), g, t))
    # ... and the coordinate descent on the ``descend_splits`` best of them (a large space: most splits are far
    # off at any setting, and the neighbouring-split check below still probes around the best). A sweep keeps
    # its fastest value; a value whose floor is above the sweep's best so far (the current point's included)
    # cannot be it and is skipped.
    for _, g, t in sorted(descend)[:descend_splits]:
        cur = Candidate(g, t, *start)
        for axis in ("fragment_size", "chunk", "max_stale_fraction", "fragment_size"):
            values = {"fragment_size": frags, "chunk": chunks, "max_stale_fraction": stales}[axis]
            here = seen.get(cur)
            above = here.step_time if here is not None else float("inf")
            sweep = [(i, replace(cur, **{axis: v})) for i, v in enumerate(values)]
            for _, c in sweep:
                order.setdefault(c, len(order))
            tried = []  # (step time, position in the sweep, value): the first fastest value, lowest floor first
            for _, i, c in sorted((pc[1], i, c) for i, c in sweep if (pc := priced(c)) is not None):
                p = probe(c, above)
                if p is not None:
                    tried.append((p.step_time, i, values[i]))
                    above = min(above, p.step_time)
            if tried:
                cur = replace(cur, **{axis: min(tried)[2]})
    # the neighbouring splits of the best with its fragment, chunk and stale cap (probed, so they compete)
    checked: set = set()
    while probes:
        best = min(probes, key=_rank).candidate
        if best in checked:
            break
        checked.add(best)
        for g in (best.n_gen - 1, best.n_gen + 1):
            if (g, workers - g) in costs and best.n_gen > 0:
                probe(replace(best, n_gen=g, n_train=workers - g))
    if not probes:
        why = "; ".join(f"{k}: {v}" for k, v in refused.items()) or "no candidate fits train.memory_gb"
        raise PlanSearchError(f"no plan of {mode.value} on {workers} workers can be priced ({why})", refused)
    probes.sort(key=lambda p: p.order)  # the unpruned search's order (its ties go to the earlier probe)
    best = min(probes, key=_rank)
    out = SearchResult(mode.value, workers, best, probes, refused, pruned=pruned[0], costs=costs)
    out.config = fitted(cfg, best.candidate, fit)
    out.robustness = robustness(out, costs, probe_steps) if robust else {}
    return out


def robustness(res: SearchResult, costs: dict, probe_steps: int) -> dict:
    """Step time of the chosen plan with every op x 0.8 and x 1.2, with rollout and training costs skewed
    against each other (x 0.8 / x 1.2 and the reverse; and the split that is then fastest among each split's
    best probe), and of the neighbouring splits (g +- 1) with the same fragment, chunk and stale cap."""
    b = res.best
    plan = replace(b.plan, steps=probe_steps)
    cost = costs[(b.candidate.n_gen, b.candidate.n_train)]

    def at(p, c) -> float:
        return steady_step_time(p, c)

    out = {"uniform": {f"x{f:g}": at(plan, ScaledCost(cost, f, f)) for f in (0.8, 1.2)}, "skewed": {}}
    per_split: dict[tuple[int, int], Probe] = {}
    for p in res.probes:
        k = (p.candidate.n_gen, p.candidate.n_train)
        if k not in per_split or p.step_time < per_split[k].step_time:
            per_split[k] = p
    for gf, tf in ((0.8, 1.2), (1.2, 0.8)):
        times = {k: at(replace(p.plan, steps=probe_steps), ScaledCost(costs[k], gf, tf))
                 for k, p in per_split.items()}
        fastest = min(times, key=times.get)
        key = f"rollout x{gf:g}, training x{tf:g}"
        out["skewed"][key] = {"chosen_s": times[(b.candidate.n_gen, b.candidate.n_train)],
                              "best_split": f"{fastest[0]}+{fastest[1]}", "best_split_s": times[fastest]}
    out["neighbours"] = {}
    for p in res.probes:
        c = p.candidate
        if (abs(c.n_gen - b.candidate.n_gen) == 1 and c.fragment_size == b.candidate.fragment_size
                and c.chunk == b.candidate.chunk and c.max_stale_fraction == b.candidate.max_stale_fraction):
            out["neighbours"][f"{c.n_gen}+{c.n_train}"] = p.step_time
    return out


__all__ = ["Candidate", "PlanSearchError", "Probe", "ScaledCost", "SearchResult", "apply", "candidate_plan", "fitted",
           "profile_costs",
           "profile_pools", "robustness", "search"]
