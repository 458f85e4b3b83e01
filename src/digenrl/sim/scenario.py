"""A model/testbed preset as the planner's source (``digenrl simulate --model M --testbed X``): which values each
axis of ``sim.planner`` may take on it, and how a candidate becomes a cost model and a ``StepPlan``.

A candidate's plan (``make_plan``): P x G of the workload, its fragment size, S trained out of T, the worker ids
of ``control.run_plan`` (``gen<i>``; a sharded trainer pool is k shard groups ``shard<i>`` of lanes; replicated
lanes of a sequence-parallel pool are ``sp<i>``), the publish path's flags, the gang width, the stale cap and hold,
and the chunk shape of the planner's one rule (``schedule.layout.choose_chunk_shape`` priced by the candidate's
cost model, at most its memory plan's chunk). The colocated mode is the flow_grpo / VeRL-Omni baseline, unpacked
(one fragment per action, one trained timestep per chunk). Its cost model is the roofline of the candidate's
training (``sim.roofline``), wrapped by the scenario's ``variant`` (``sim.variants``, ``sim.baselines``), or a
measured profile at the candidate's trainer count (``control.profile.profile_at``).

Values (``PresetSource.values``): with roofline costs, every axis the planner's docstring lists (sequence-parallel
degrees: ``_degrees``); a profile prices only the pools it was measured on: the scenario's own training settings.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from ..control.profile import profile_at
from ..control.run_plan import rank_groups, worker_ids
from ..control.timeline import RunResult
from ..schedule import BTSConfig, CostModel, Durations, Mode, StepPlan
from ..schedule.cost import GENERATOR, TRAINER, Op
from ..schedule.layout import choose_chunk_shape
from .assumptions import DEFAULT, Assumptions
from .executor import simulate
from .planner import MAX_SHARD_GROUPS, Candidate, Infeasible, SearchResult, Split, divisors, search
from .presets import PUBLISH_PATHS, ModelPreset, Testbed, Workload
from .roofline import RooflineCost


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
    variant: Callable[[RooflineCost], CostModel] | None = None  # wraps the roofline (``sim.variants``)
    assume: Assumptions = DEFAULT  # the roofline's named assumptions (``sim.assumptions``)
    profile_trainers: int | None = None  # the trainer ranks the profile was measured at (its 'trainers' key)

    def __post_init__(self) -> None:
        if self.gpus < 2 or self.gpus > self.testbed.total:
            raise ScenarioError(f"--gpus: {self.gpus} is outside 2..{self.testbed.total} for testbed "
                                f"{self.testbed.name}")
        if self.steps < 1:
            raise ScenarioError(f"--steps: must be >= 1 (got {self.steps})")


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


def with_candidate(setup: Scenario, c: Candidate) -> Scenario:
    """``setup`` trained as candidate ``c`` says (publish path, inference copy, shard groups, degrees)."""
    t = setup.workload.training
    t = replace(t, publish=c.publish, tag_copy=c.tag_copy, shard_groups=c.shard_groups,
                sequence_parallel=c.sequence_parallel, generator_sequence_parallel=c.generator_sequence_parallel)
    return replace(setup, workload=replace(setup.workload, training=t))


def profile_cost(profile: CostModel, measured: int | None, n_train: int) -> CostModel:
    """``profile`` at ``n_train`` trainer ranks (``control.profile.profile_at``). Raises ``Infeasible``."""
    cost = profile_at(profile, measured, n_train)
    if isinstance(cost, str):
        raise Infeasible(f"--profile: {cost}")
    return cost


def make_cost(setup: Scenario, c: Candidate, colocated: bool = False):
    """The cost model of candidate ``c``: the roofline of its training (wrapped by the variant), or the profile at
    its trainer count. Raises ``Infeasible``."""
    if setup.profile is not None:
        return profile_cost(setup.profile, setup.profile_trainers, c.split.n_train)
    s = with_candidate(setup, c)
    cost = RooflineCost(s.model, s.workload, s.testbed, c.split.n_gen, c.split.n_train, colocated,
                        gen_gpu=c.split.gen_gpu, train_gpu=c.split.train_gpu, assume=s.assume)  # raises Infeasible
    return s.variant(cost) if s.variant is not None else cost


def limits(cost, w: Workload) -> tuple[int, int]:
    """(largest fragment, largest chunk) the cost model's memory holds (a profile: G and G x S)."""
    cost = getattr(cost, "base", cost)  # a variant of the roofline keeps its memory limits
    if isinstance(cost, RooflineCost):
        return cost.max_fragment, cost.max_chunk
    return w.generations, w.generations * w.trained_timesteps


def rule_chunk(plan: StepPlan, cost, max_cells: int) -> tuple[int, int]:
    """The planner's one chunk-shape rule for ``plan`` on ``cost`` (TSP modes; else the plan's own)."""
    if not plan.mode.tsp:
        return plan.chunk_generations, plan.chunk_timesteps
    return choose_chunk_shape(plan.generations, plan.trained_timesteps, len(plan.trainers),
                              Durations(plan, cost).train, max_cells)


def make_plan(setup: Scenario, mode: Mode, c: Candidate, cost) -> StepPlan:
    """The step plan of candidate ``c`` (module docstring). Raises ``Infeasible`` for a fragment the generators'
    memory does not hold."""
    w = setup.workload
    colocated = mode is Mode.COLOCATED
    gens, ranks = worker_ids(mode, c.generators, c.split.n_train)
    grouped = w.training.sharded and not colocated
    try:
        trainers, _ = rank_groups(ranks, grouped, c.shard_groups if grouped else 1, c.sequence_parallel)
    except ValueError as e:
        raise Infeasible(str(e)) from None
    max_frag, max_cells = limits(cost, w)
    if c.fragment_size > max(1, max_frag):
        raise Infeasible(f"fragment {c.fragment_size}: a generator holds {max_frag} trajectories")
    joins = not colocated and c.publish in ("broadcast", "stream")
    plan = StepPlan(w.prompts, w.generations, c.fragment_size, w.trained_timesteps, w.denoise_steps, 1, 1,
                    gens, trainers, mode, setup.steps, c.max_stale_fraction,
                    shard_ranks=len(ranks) // len(trainers) // c.sequence_parallel if grouped else 1,
                    sequence_parallel=c.sequence_parallel, generator_sequence_parallel=c.generator_sequence_parallel,
                    publish_joins=joins, publish_streams=joins and c.publish == "stream",
                    stale_hold=c.stale_hold, gang_groups=c.gang_groups, sample_batch=w.sample_batch)
    cg, cs = rule_chunk(plan, cost, max_cells)
    return replace(plan, chunk_generations=cg, chunk_timesteps=cs)


class PresetSource:
    """The planner's source of a ``Scenario`` in one mode (module docstring). ``gen_gpus``, ``split``,
    ``shard_groups``: pin those; everything else is searched."""

    def __init__(self, setup: Scenario, mode: Mode | str, bts: BTSConfig | None = None, *, gen_gpus: int | None = None,
                 split: Split | None = None, shard_groups: int | None = None):
        self.setup, self.mode, self.bts = setup, Mode(mode), bts
        self.workers, self.pinned_k = setup.gpus, shard_groups
        if split is not None:
            self._splits = [split]
        elif self.mode is Mode.COLOCATED:
            self._splits = colocated_options(setup)
        else:
            self._splits = [s for s in split_options(setup) if gen_gpus is None or s.n_gen == gen_gpus]
            if not self._splits:
                raise ScenarioError(f"--gen-gpus: {gen_gpus} generators cannot be placed with --gpus {setup.gpus} "
                                    f"on testbed {setup.testbed.name}")
        self._starts: dict[Split, Candidate] = {}

    @property
    def roofline(self) -> bool:
        return self.setup.profile is None

    def splits(self) -> list[Split]:
        return self._splits

    def values(self, split: Split, axis: str, start: Candidate | None = None) -> list:
        t, mode, roof = self.setup.workload.training, self.mode, self.roofline
        grouped = t.sharded and mode is not Mode.COLOCATED
        start = start or self.start(split)
        if axis == "fragment_size":
            return divisors(self.setup.workload.generations)
        if axis == "max_stale_fraction":
            return [start.max_stale_fraction]
        if axis == "shard_groups":
            if self.pinned_k is not None:
                return [self.pinned_k]
            if not (grouped and mode.tsp and roof):
                return [start.shard_groups]
            return [k for k in range(1, MAX_SHARD_GROUPS + 1) if split.n_train % k == 0 and split.n_train // k >= 2] \
                or [start.shard_groups]
        if axis == "tag_copy":
            return [False, True] if (mode.tag and grouped and roof) else [start.tag_copy]
        if axis == "gang_groups":
            return [True, False] if (mode.tag and grouped and roof) else [True]
        if axis == "publish":
            return self._publish_paths(split) if (mode.disaggregated and roof) else [start.publish]
        if axis == "sequence_parallel":
            return self._degrees(split.n_train) if roof else [start.sequence_parallel]
        if axis == "generator_sequence_parallel":
            return self._degrees(split.n_gen) if (roof and mode.disaggregated) else [start.generator_sequence_parallel]
        raise KeyError(axis)

    def _degrees(self, gpus: int) -> list[int]:
        """Ulysses degrees for a family with a sequence-parallel plan (``models.specs``): 1 and the powers of two
        up to one node's GPUs that divide the heads and ``gpus`` (a group stays inside a node, at NVLink rate)."""
        spec, tb = self.setup.model.spec, self.setup.testbed
        if not spec.sequence_parallel:
            return [1]
        return [1] + [d for d in (2, 4, 8) if d <= tb.node_gpus and spec.heads % d == 0 and gpus % d == 0]

    def _publish_paths(self, split: Split) -> list[str]:
        """Outside TCSS the generators are idle at every final commit (each fragment of the step is in before it,
        and none of the next step exists before the publish), so a publish they join never waits: the path of
        the shortest span from the commit's end to the generators holding the version wins, and alone is tried
        (a stream's span: the trainers' send, in the commit, plus the generators' receive). In ``full`` a joined
        publish waits for the generators' stale fragments and a stream lets the trainers go on: all are tried."""
        if self.mode.tcss:
            return list(PUBLISH_PATHS)
        priced = []
        for path in PUBLISH_PATHS:
            try:
                cost = make_cost(self.setup, replace(self.start(split), publish=path))
            except Infeasible:
                continue
            span = cost.time(Op.PUBLISH.value, 1, TRAINER)
            if path == "stream":
                span += cost.time(Op.PUBLISH.value, 1, GENERATOR)
            priced.append((span, path))
        return [min(priced)[1]] if priced else [self.setup.workload.training.publish]

    def start(self, split: Split) -> Candidate:
        """The scenario's own training settings, the smallest sequence-parallel degrees (trainer first) whose memory
        plan fits, and fragments of at most 4 generations."""
        if split not in self._starts:
            t, w = self.setup.workload.training, self.setup.workload
            grouped = t.sharded and self.mode is not Mode.COLOCATED
            k = self.pinned_k or (t.shard_groups if grouped else 1)
            c = Candidate(split, 1, self.setup.max_stale_fraction if self.mode.tcss else 0.0, k, t.tag_copy,
                          t.publish, True, t.sequence_parallel, t.generator_sequence_parallel)
            degrees = [(d, g) for d in self.values(split, "sequence_parallel", c)
                       for g in self.values(split, "generator_sequence_parallel", c)]
            frag = w.generations
            for d, g in degrees:
                try:
                    frag = limits(make_cost(self.setup, replace(c, sequence_parallel=d, generator_sequence_parallel=g),
                                            self.mode is Mode.COLOCATED), w)[0]
                except Infeasible:
                    continue
                c = replace(c, sequence_parallel=d, generator_sequence_parallel=g)
                break
            c = replace(c, fragment_size=max([f for f in divisors(w.generations) if f <= min(4, max(1, frag))]))
            self._starts[split] = c
        return self._starts[split]

    def build(self, c: Candidate):
        cost = make_cost(self.setup, c, self.mode is Mode.COLOCATED)
        return cost, make_plan(self.setup, self.mode, c, cost)


@dataclass
class ModeRun:
    """One simulated mode: its chosen candidate and plan, and the run."""

    mode: Mode
    candidate: Candidate
    plan: StepPlan
    result: RunResult
    note: str = ""
    search: SearchResult | None = None

    @property
    def split(self) -> Split:
        return self.candidate.split

    @property
    def n_gen(self) -> int:
        return self.split.n_gen

    @property
    def n_train(self) -> int:
        return self.split.n_train

    @property
    def tag_copy(self) -> bool:
        return self.candidate.tag_copy and self.mode.tag and self.plan.shard_ranks * self.plan.sequence_parallel > 1

    @property
    def publish(self) -> str:
        return self.candidate.publish if self.mode.disaggregated else ""

    @property
    def shard_groups(self) -> int:
        return self.candidate.shard_groups if len(self.plan.trainers) > 1 and self.plan.shard_ranks > 1 else 1


def run_mode(setup: Scenario, mode: Mode | str, gen_gpus: int | None = None, jitter: float = 0.0, seed: int = 0,
             bts: BTSConfig | None = None, record: bool = False, shard_groups: int | None = None,
             split: Split | None = None, probe_steps: int = 4) -> ModeRun:
    """The planner's choice for one mode (``gen_gpus``, ``shard_groups``, ``split``: pinned), simulated for the
    scenario's steps; the pick is the least makespan / K over those steps among the candidates the search looked
    at (``sim.planner``, ``run_steps``)."""
    src = PresetSource(setup, mode, bts, gen_gpus=gen_gpus, split=split, shard_groups=shard_groups)
    try:
        # (search's default: every combination up to 64 per split); the pick at the run's own length
        res = search(src, probe_steps=probe_steps, run_steps=setup.steps)
    except ValueError as e:
        opt = "--testbed" if src.mode is Mode.COLOCATED else "--gen-gpus"
        raise ScenarioError(f"{opt}: {e}") from None
    return run_candidate(setup, src.mode, res.best.candidate, jitter, seed, bts, record, res)


def run_candidate(setup: Scenario, mode: Mode | str, c: Candidate, jitter: float = 0.0, seed: int = 0,
                  bts: BTSConfig | None = None, record: bool = False, res: SearchResult | None = None) -> ModeRun:
    """Candidate ``c`` simulated for the scenario's steps."""
    mode = Mode(mode)
    cost, plan = PresetSource(setup, mode, bts, split=c.split).build(c)
    run = simulate(plan, cost, jitter=jitter, seed=seed, bts=bts, record=record)
    return ModeRun(mode, c, plan, run, note=c.split.label(setup.testbed.heterogeneous), search=res)


__all__ = ["ModeRun", "PresetSource", "Scenario", "ScenarioError", "colocated_options", "make_cost",
           "make_plan", "profile_cost", "run_candidate", "run_mode", "split_options", "with_candidate"]
