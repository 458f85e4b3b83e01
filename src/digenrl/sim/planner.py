"""Turn (model, testbed, GPUs, workload, mode) into a step plan and a cost model, and pick the split.

Choices, each made from the cost model alone (never from simulated speedups of other modes):

* fragment size f (a divisor of G): pipelined modes take the smallest f whose per-generation time is within
  10 % of the best batch (fine fragments make groups complete early); barrier modes (``naive``,
  ``colocated``) minimise ceil(B / f / workers) * Generate(f) (only the end of the rollout matters);
* TSP chunk shape (cg x cs cells, at most ``max_chunk`` for memory: N x the per-rank cells on a sharded pool,
  which is one shard group, the scheduler's single trainer): minimise
  n_chunks * Train(cg * cs) / N_t + Train(cg * cs) (pool throughput plus the last chunk's tail);
* generator/trainer split (when not given; on a heterogeneous testbed also which GPU kind hosts which pool):
  the 5 options with the best analytic bound max(rollout work / N_g, training work / N_t) are simulated
  for a few steps; the fastest is kept. Colocation on a heterogeneous testbed runs on one homogeneous part,
  or on all GPUs in lock-step at the pace and memory of the weaker kind; the fastest is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..control.run_plan import shard_groups, worker_ids
from ..control.timeline import RunResult
from ..schedule import BTSConfig, CostModel, Durations, Mode, StepPlan, step_fragments, tsp_chunks
from .executor import simulate
from .presets import GPU, ModelPreset, Testbed, Workload
from .roofline import InfeasibleError, RooflineCost


class ScenarioError(ValueError):
    """Bad simulation input; the message names the option and the value."""


@dataclass(frozen=True)
class Scenario:
    model: ModelPreset
    testbed: Testbed
    workload: Workload
    gpus: int
    steps: int = 20
    max_stale_fraction: float = 0.5
    profile: CostModel | None = None   # measured costs replace the roofline when given

    def __post_init__(self) -> None:
        if self.gpus < 2 or self.gpus > self.testbed.total:
            raise ScenarioError(f"--gpus: {self.gpus} is outside 2..{self.testbed.total} for testbed "
                             f"{self.testbed.name}")
        if self.steps < 1:
            raise ScenarioError(f"--steps: must be >= 1 (got {self.steps})")


@dataclass(frozen=True)
class Split:
    """A generator/trainer split and the GPU kind of each pool."""

    n_gen: int
    n_train: int
    gen_gpu: GPU
    train_gpu: GPU

    def label(self, heterogeneous: bool) -> str:
        if not heterogeneous:
            return ""
        if self.n_gen == 0:
            return f"colocated on {self.n_train} x {self.train_gpu.name}"
        return f"gen {self.gen_gpu.name}, trn {self.train_gpu.name}"


@dataclass
class ModeRun:
    mode: Mode
    split: Split
    plan: StepPlan
    result: RunResult
    note: str = ""

    @property
    def n_gen(self) -> int:
        return self.split.n_gen

    @property
    def n_train(self) -> int:
        return self.split.n_train


def split_options(setup: Scenario) -> list[Split]:
    """Every split of ``setup.gpus`` GPUs into two non-empty pools, each pool on one GPU kind."""
    n, out = setup.gpus, []
    for gen_gpu, gen_max, train_gpu, train_max in setup.testbed.assignments():
        hi = n - 1 if not setup.testbed.heterogeneous else min(gen_max, n - 1)
        lo = 1 if not setup.testbed.heterogeneous else max(1, n - train_max)
        out.extend(Split(g, n - g, gen_gpu, train_gpu) for g in range(lo, hi + 1))
    return out


def colocated_options(setup: Scenario) -> list[Split]:
    """Colocation needs one pace: a homogeneous part, or all GPUs in lock-step at the weaker kind's pace."""
    tb, n = setup.testbed, setup.gpus
    if not tb.heterogeneous:
        return [Split(0, n, tb.gpu, tb.gpu)]
    weak = tb.weakest()
    return [Split(0, min(n, tb.count), tb.gpu, tb.gpu), Split(0, min(n, tb.count2), tb.gpu2, tb.gpu2),
            Split(0, n, weak, weak)]


def make_cost(setup: Scenario, split: Split, colocated: bool = False):
    if setup.profile is not None:
        return setup.profile
    return RooflineCost(setup.model, setup.workload, setup.testbed, split.n_gen, split.n_train, colocated,
                        gen_gpu=split.gen_gpu, train_gpu=split.train_gpu)


def _limits(cost, w: Workload) -> tuple[int, int]:
    if isinstance(cost, RooflineCost):
        return cost.max_fragment, cost.max_chunk
    return w.generations, w.generations * w.trained_timesteps


def choose_fragment_size(mode: Mode, w: Workload, workers: int, gen_time, max_frag: int) -> int:
    divs = [f for f in range(1, w.generations + 1) if w.generations % f == 0 and f <= max_frag] or [1]
    if mode.pipelined:
        per = {f: gen_time(f) / f for f in divs}
        best = min(per.values())
        return min(f for f in divs if per[f] <= 1.1 * best)
    frags = w.prompts * w.generations
    return min(divs, key=lambda f: (math.ceil(frags / f / workers) * gen_time(f), -f))


def choose_chunk_shape(w: Workload, n_train: int, train_time, max_cells: int) -> tuple[int, int]:
    g, s = w.generations, w.trained_timesteps
    best, shape = None, (1, 1)
    for cg in range(1, g + 1):
        for cs in range(1, s + 1):
            if cg * cs > max_cells:
                continue
            n = math.ceil(g / cg) * math.ceil(s / cs)
            t = train_time(cg * cs)
            key = (n * t / n_train + t, -cg * cs)
            if best is None or key < best:
                best, shape = key, (cg, cs)
    return shape


def make_plan(setup: Scenario, mode: Mode, n_gen: int, n_train: int, cost) -> StepPlan:
    w = setup.workload
    colocated = mode is Mode.COLOCATED
    gens, ranks = worker_ids(mode, n_gen, n_train)
    # a sharded trainer pool is one shard group (the runtime's): the scheduler's single trainer
    trainers, _ = shard_groups(ranks, w.training.sharded and not colocated)
    probe = StepPlan(w.prompts, w.generations, 1, w.trained_timesteps, w.sampling_steps, 1, 1,
                     gens, trainers, mode, setup.steps, setup.max_stale_fraction)
    dur = Durations(probe, cost)
    max_frag, max_cells = _limits(cost, w)
    f = choose_fragment_size(mode, w, n_train if colocated else n_gen,
                             lambda n: dur.generate(n, colocated, False), max_frag)
    cg, cs = choose_chunk_shape(w, len(trainers), dur.train, max_cells) if mode.tsp else (1, 1)
    return replace(probe, fragment_size=f, chunk_generations=cg, chunk_timesteps=cs)


def analytic_bound(plan: StepPlan, cost) -> float:
    """max(rollout work / N_g, training work / N_t) + commit + publish: a lower bound of a pipelined step."""
    d = Durations(plan, cost)
    coloc = not plan.generators
    gen = sum(d.generate(fr.size, coloc, False) for fr in step_fragments(plan, 0))
    train = plan.prompts * sum(d.train(c.size) for c in tsp_chunks(plan, 0, 0))
    if coloc:  # colocated: the same ranks do both, one after the other
        return (gen + train) / len(plan.trainers) + d.commit()
    return max(gen / len(plan.generators), train / len(plan.trainers)) + d.commit() + d.publish()


def _build(setup: Scenario, mode: Mode, split: Split):
    cost = make_cost(setup, split, mode is Mode.COLOCATED)
    return cost, make_plan(setup, mode, split.n_gen, split.n_train, cost)


def choose_split(setup: Scenario, mode: Mode, options: list[Split], bts: BTSConfig | None = None,
                 probe_steps: int = 3, keep: int = 5) -> Split:
    """Simulate the ``keep`` options with the best analytic bound for a few steps; return the fastest."""
    cands = []
    for split in options:
        try:
            cost, plan = _build(setup, mode, split)
        except InfeasibleError:
            continue
        cands.append((analytic_bound(plan, cost), len(cands), split))
    if not cands:
        raise ScenarioError(f"--gpus: no generator/trainer split of {setup.gpus} GPUs fits "
                         f"{setup.model.name} on testbed {setup.testbed.name}")
    cands.sort(key=lambda c: c[:2])
    if len(cands) == 1:
        return cands[0][2]
    short = replace(setup, steps=min(setup.steps, probe_steps))
    best = None
    for _, _, split in cands[:keep]:
        cost, plan = _build(short, mode, split)
        t = simulate(plan, cost, bts=bts, record=False).step_time
        if best is None or t < best[0]:
            best = (t, split)
    return best[1]


def run_mode(setup: Scenario, mode: Mode | str, gen_gpus: int | None = None, jitter: float = 0.0, seed: int = 0,
             bts: BTSConfig | None = None, record: bool = False) -> ModeRun:
    """Simulate one mode; without ``gen_gpus`` the split (and, heterogeneous, the pool kinds) is searched."""
    mode = Mode(mode)
    het = setup.testbed.heterogeneous
    if mode is Mode.COLOCATED:
        options = colocated_options(setup)
    else:
        options = split_options(setup)
        if gen_gpus is not None:
            options = [p for p in options if p.n_gen == gen_gpus]
            if not options:
                raise ScenarioError(f"--gen-gpus: {gen_gpus} generators cannot be placed with --gpus {setup.gpus} "
                                 f"on testbed {setup.testbed.name}")
    try:
        split = options[0] if len(options) == 1 else choose_split(setup, mode, options, bts)
        cost, plan = _build(setup, mode, split)
    except InfeasibleError as e:
        opt = "--testbed" if mode is Mode.COLOCATED else "--gen-gpus"
        raise ScenarioError(f"{opt}: {e}") from None
    res = simulate(plan, cost, jitter=jitter, seed=seed, bts=bts, record=record)
    return ModeRun(mode, split, plan, res, note=split.label(het))


__all__ = ["ModeRun", "Scenario", "ScenarioError", "Split", "choose_split", "make_plan", "split_options", "run_mode"]
