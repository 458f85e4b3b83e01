"""Turn (model, testbed, GPUs, workload, mode) into a step plan and a cost model, and pick the split.

Choices, each made from the cost model alone (never from simulated speedups of other modes):

* fragment size f (a divisor of G): pipelined modes take the smallest f whose per-generation time is within
  10 % of the best batch (fine fragments make groups complete early); barrier modes (``naive``,
  ``colocated``) minimise ceil(B / f / workers) * Generate(f) (only the end of the rollout matters);
* TSP chunk shape (cg x cs cells, at most ``max_chunk`` for memory: g x the per-rank cells on a sharded pool
  of k shard groups of g ranks, each a scheduler trainer): minimise
  n_chunks * Train(cg * cs) / N_t + Train(cg * cs) (pool throughput plus the last chunk's tail);
* generator/trainer split (when not given; on a heterogeneous testbed also which GPU kind hosts which pool):
  every feasible candidate (split x fragment size x shard groups x copy x publish path x gang width) is
  simulated for 3 steps, the ``FINALISTS`` fastest of each shard-group count for the scenario's steps, and
  the fastest of those is kept. Colocation on a heterogeneous testbed runs on one homogeneous part,
  or on all GPUs in lock-step at the pace and memory of the weaker kind; the fastest is kept;
* shard groups (sharded pool under TSP, roofline costs; ``group_options``): k = 1 (one group of all ranks)
  or hybrid sharding, k <= 6 groups of at least 2 ranks, each simulated;
* publish path (roofline costs, disaggregated modes; ``publish_paths``): the object store (rank 0 stages the
  state in host memory, each generator fetches it), a broadcast the generators join
  (``StepPlan.publish_joins``), or a stream of every rank's shard that the generators join while the trainers
  go on (``StepPlan.publish_streams``). Outside TCSS the cheapest by the cost model; in ``full`` all are
  simulated;
* stale hold (``full`` with a broadcast publish; ``schedule.stale_hold``): the chosen plan is run with each
  h of ``STALE_HOLDS`` (0: off) and the fastest is kept;
* gang width (TAG on a shard group; ``StepPlan.gang_groups``): gangs across prompt groups or of the head
  group only, both simulated (a wide gang fills every rank's batch; a narrow one ends sooner, which a
  pipeline that is waiting for the head group's rewards can prefer: Qwen-Image/B).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from ..control.run_plan import shard_groups, worker_ids
from ..control.timeline import RunResult
from ..schedule import BTSConfig, CostModel, Durations, Mode, StepPlan, step_fragments, tsp_chunks
from ..schedule import stale_hold
from ..schedule.cost import GENERATOR, TRAINER, Op
from ..schedule.layout import choose_chunk_shape as layout_chunk_shape
from .assumptions import DEFAULT, Assumptions
from .executor import simulate
from .presets import GPU, PUBLISH_PATHS, ModelPreset, Testbed, Workload
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
    variant: Callable[[RooflineCost], CostModel] | None = None  # wraps the roofline (``sim.variants``)
    assume: Assumptions = DEFAULT  # the roofline's named assumptions (``sim.assumptions``)

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
    tag_copy: bool = False   # TAG on the shard group builds a bf16 inference copy (Training.tag_copy)
    publish: str = ""        # the publish path (Training.publish; "" in colocated mode)
    shard_groups: int = 1    # hybrid sharding: shard groups of the sharded trainer pool (Training.shard_groups)
    stale_hold: float = 0.0  # full + broadcast: the generators' stale-fragment hold (runtime.stale_hold)
    gang_groups: bool = True  # TAG on a shard group: gangs across prompt groups (runtime.gang_groups)

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
    cost = RooflineCost(setup.model, setup.workload, setup.testbed, split.n_gen, split.n_train, colocated,
                        gen_gpu=split.gen_gpu, train_gpu=split.train_gpu, assume=setup.assume)
    return setup.variant(cost) if setup.variant is not None else cost


def _limits(cost, w: Workload) -> tuple[int, int]:
    cost = getattr(cost, "base", cost)  # a variant of the roofline keeps its memory limits
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
    """``schedule.layout.choose_chunk_shape`` for the workload's G x S grid on ``n_train`` scheduler trainers."""
    return layout_chunk_shape(w.generations, w.trained_timesteps, n_train, train_time, max_cells)


def fragment_sizes(w: Workload, max_frag: int) -> list[int]:
    """The fragment sizes the split search tries: the divisors of G that fit a generator's memory."""
    return [f for f in range(1, w.generations + 1) if w.generations % f == 0 and f <= max_frag] or [1]


def make_plan(setup: Scenario, mode: Mode, n_gen: int, n_train: int, cost,
              fragment_size: int | None = None) -> StepPlan:
    """The step plan of one split; ``fragment_size`` None: the cost-model rule of ``choose_fragment_size``."""
    w = setup.workload
    colocated = mode is Mode.COLOCATED
    gens, ranks = worker_ids(mode, n_gen, n_train)
    # a sharded trainer pool is k shard groups (the runtime's; k = training.shard_groups, 1 without hybrid
    # sharding): k scheduler trainers of N / k ranks each
    grouped = w.training.sharded and not colocated
    k = w.training.shard_groups if grouped else 1
    trainers, _ = shard_groups(ranks, grouped, k)
    probe = StepPlan(w.prompts, w.generations, 1, w.trained_timesteps, w.denoise_steps, 1, 1,
                     gens, trainers, mode, setup.steps, setup.max_stale_fraction,
                     shard_ranks=len(ranks) // k if grouped else 1,
                     publish_joins=not colocated and w.training.publish in ("broadcast", "stream"),
                     publish_streams=not colocated and w.training.publish == "stream")
    dur = Durations(probe, cost)
    max_frag, max_cells = _limits(cost, w)
    f = fragment_size or choose_fragment_size(mode, w, n_train if colocated else n_gen,
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


def with_training(setup: Scenario, tag_copy: bool | None = None, publish: str | None = None,
                  shard_groups: int | None = None) -> Scenario:
    """``setup`` whose training builds (or not) a TAG inference copy on a shard group (``tag_copy``), publishes
    through ``publish`` (``object_store``, ``broadcast`` or ``stream``) and shards over ``shard_groups`` groups (hybrid
    sharding); None keeps the scenario's own setting."""
    t = setup.workload.training
    changes = {k: v for k, v in (("tag_copy", tag_copy), ("publish", publish), ("shard_groups", shard_groups))
               if v is not None and getattr(t, k) != v}
    if not changes:
        return setup
    return replace(setup, workload=replace(setup.workload, training=replace(t, **changes)))


@dataclass(frozen=True)
class Choice:
    """What the split search settled on: the split, the fragment size, whether TAG builds an inference copy,
    the publish path and the shard groups (None: the scenario's own setting)."""

    split: Split
    fragment_size: int | None = None
    tag_copy: bool | None = None
    publish: str | None = None
    shard_groups: int | None = None
    gang_groups: bool = True


def _build(setup: Scenario, mode: Mode, split: Split, fragment_size: int | None = None,
           tag_copy: bool | None = None, publish: str | None = None, shard_groups: int | None = None,
           gang_groups: bool = True):
    setup = with_training(setup, tag_copy, publish, shard_groups)
    cost = make_cost(setup, split, mode is Mode.COLOCATED)
    plan = make_plan(setup, mode, split.n_gen, split.n_train, cost, fragment_size)
    return cost, replace(plan, gang_groups=gang_groups)


def _built(setup: Scenario, mode: Mode, c: "Choice"):
    """``_build`` of a candidate."""
    return _build(setup, mode, c.split, c.fragment_size, c.tag_copy, c.publish, c.shard_groups, c.gang_groups)


def publish_paths(setup: Scenario, mode: Mode, split: Split, tag_copy: bool | None,
                  shard_groups: int | None = None) -> list[str | None]:
    """The publish paths worth simulating for one split (roofline costs, disaggregated modes): outside TCSS the
    generators are idle at every final commit (each of the step's fragments is in before it, and no fragment of
    the next step exists before the publish), so a broadcast they join never waits and the path of the shortest
    span from the final commit's end to the generators holding the version is the faster one: it alone is
    tried (a stream's span is the trainers' send, in the commit, plus the generators' receive: outside TCSS
    the trainers have nothing to train meanwhile). In ``full`` a joined publish waits for the generators'
    in-flight stale fragments (``StepPlan.publish_joins``) and a stream lets the trainers go on, so every path
    is simulated."""
    if mode is Mode.COLOCATED or setup.profile is not None:
        return [None]
    if mode.tcss:
        return list(PUBLISH_PATHS)
    priced = []
    for path in PUBLISH_PATHS:
        try:
            cost = make_cost(with_training(setup, tag_copy, path, shard_groups), split)
        except InfeasibleError:
            continue
        span = cost.time(Op.PUBLISH.value, 1, TRAINER)
        if path == "stream":
            span += cost.time(Op.PUBLISH.value, 1, GENERATOR)
        priced.append((span, path))
    return [min(priced)[1]] if priced else [None]


MAX_SHARD_GROUPS = 6  # hybrid sharding: the planner tries k <= 6 shard groups (benchmarks/hybrid_whatif.py: k = 2-6)


def group_options(setup: Scenario, mode: Mode, split: Split, pinned: int | None = None) -> list[int | None]:
    """The shard-group counts k worth trying for one split: a sharded pool under TSP (roofline costs) tries
    every k <= ``MAX_SHARD_GROUPS`` that divides the trainer ranks into groups of at least 2 (hybrid sharding:
    k scheduler trainers that train chunks side by side, against one group whose every chunk is a collective
    of all ranks); otherwise the scenario's own setting. ``pinned``: only k = ``pinned`` (none where it does
    not divide the split's trainer ranks)."""
    w = setup.workload
    if mode is Mode.COLOCATED or not w.training.sharded or setup.profile is not None:
        return [None]
    n = split.n_train
    if pinned is not None:
        return [pinned] if n % pinned == 0 else []
    if not mode.tsp:
        return [None]
    return [k for k in range(1, MAX_SHARD_GROUPS + 1) if n % k == 0 and n // k >= 2] or [None]


def candidates(setup: Scenario, mode: Mode, options: list[Split], shard_groups: int | None = None) -> list[Choice]:
    """Every feasible (split, shard groups, inference copy, publish path, fragment size) of ``options``. A
    pipelined mode tries every fragment size that fits (fine fragments make groups complete early, coarse ones
    batch the generators better: which wins depends on the split); a barrier mode keeps the cost-model rule
    (only the end of its rollout matters). A TAG mode on a shard group (roofline costs) tries TAG with and
    without an inference copy (``Training.tag_copy``) where the copy fits; a sharded pool under TSP tries the
    shard-group counts of ``group_options`` (``shard_groups``: that k only)."""
    copies: list[bool | None] = [None]
    w = setup.workload
    if mode.tag and w.training.sharded and setup.profile is None:
        copies = [False, True]
    out = []
    for split in options:
        for k in group_options(setup, mode, split, shard_groups):
            for copy in copies:
                for path in publish_paths(setup, mode, split, copy, k):
                    try:
                        cost, plan = _build(setup, mode, split, None, copy, path, k)
                    except InfeasibleError:
                        continue
                    sizes = fragment_sizes(w, _limits(cost, w)[0]) if mode.pipelined else [None]
                    gangs = (True, False) if mode.tag and plan.shard_ranks > 1 else (True,)
                    out.extend(Choice(split, f, copy, path, k, wide) for f in sizes for wide in gangs)
    return out


# The fastest probes of each shard-group count that ``choose_split`` runs for the scenario's own steps. A 3-step
# probe ranks the candidates only roughly: on Qwen-Image/B the best plan over 20 steps (66.1 s) was the 3rd
# fastest probe, the fastest probe 67.2 s over 20 steps.
FINALISTS = 3


def choose_split(setup: Scenario, mode: Mode, options: list[Split], bts: BTSConfig | None = None,
                 probe_steps: int = 3, shard_groups: int | None = None) -> Choice:
    """Simulate every feasible (split, fragment size, ...) for ``probe_steps`` steps (no analytic pre-selection:
    on a shard group the step time is a staircase in the trainer count, which a work bound cannot see), then
    run the ``FINALISTS`` fastest probes of each shard-group count for the scenario's own steps; the fastest of
    those wins. A short probe flatters some candidates (their pipelines fill sooner, or a gang lands well in
    the first steps), and this way the pick is never slower over the run than the fastest probe of any k."""
    cands = candidates(setup, mode, options, shard_groups)
    if not cands:
        raise ScenarioError(f"--gpus: no generator/trainer split of {setup.gpus} GPUs fits "
                         f"{setup.model.name} on testbed {setup.testbed.name}")
    if len(cands) == 1:
        return cands[0]
    short = replace(setup, steps=min(setup.steps, probe_steps))
    probes: dict[int | None, list[tuple[float, int, Choice]]] = {}  # shard groups -> (probe time, order, choice)
    for i, c in enumerate(cands):
        cost, plan = _built(short, mode, c)
        probes.setdefault(c.shard_groups, []).append((simulate(plan, cost, bts=bts, record=False).step_time, i, c))
    if short.steps == setup.steps:
        return min((p for ps in probes.values() for p in ps), key=lambda p: p[:2])[2]
    finals = []
    for ps in probes.values():
        for t, i, c in sorted(ps, key=lambda p: p[:2])[:FINALISTS]:
            cost, plan = _built(setup, mode, c)
            finals.append((simulate(plan, cost, bts=bts, record=False).step_time, t, i, c))
    return min(finals, key=lambda f: f[:3])[3]


# ``runtime.stale_hold`` values the planner tries on its chosen ``full`` plan with a joined publish (besides 0):
# a hold only against a long overrun (0.5), and one that holds unless the generator would wait over 4x the
# overrun (4). On the 10 GPU presets 0.5 helped HunyuanVideo/B and 4 FLUX/A; no one value suits every preset.
STALE_HOLDS = (0.5, 4.0)


def best_stale_hold(plan: StepPlan, cost, bts: BTSConfig | None = None) -> float:
    """The fastest h of (0,) + ``STALE_HOLDS`` for ``plan`` (simulated for its steps); 0 where the rule does
    not apply."""
    if not stale_hold.applies(replace(plan, stale_hold=1.0)):
        return 0.0
    times = [(simulate(replace(plan, stale_hold=h), cost, bts=bts, record=False).step_time, h)
             for h in (0.0,) + STALE_HOLDS]
    return min(times)[1]


def run_mode(setup: Scenario, mode: Mode | str, gen_gpus: int | None = None, jitter: float = 0.0, seed: int = 0,
             bts: BTSConfig | None = None, record: bool = False, shard_groups: int | None = None,
             split: Split | None = None) -> ModeRun:
    """Simulate one mode; without ``gen_gpus`` the split (and, heterogeneous, the pool kinds) is searched, and
    without ``shard_groups`` the shard groups of a sharded pool (``group_options``). ``split``: this split
    only, everything else (fragment size, shard groups, copy, publish path, gang width) still searched."""
    mode = Mode(mode)
    if split is not None:
        options = [split]
        choice = choose_split(setup, mode, options, bts, shard_groups=shard_groups)
        return _run_choice(setup, mode, choice, jitter, seed, bts, record)
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
        if len(options) == 1 and shard_groups is None:  # a pinned split runs as the scenario sets it
            choice = Choice(options[0])
        else:
            choice = choose_split(setup, mode, options, bts, shard_groups=shard_groups)
        split = choice.split
        cost, plan = _built(setup, mode, choice)
    except InfeasibleError as e:
        opt = "--testbed" if mode is Mode.COLOCATED else "--gen-gpus"
        raise ScenarioError(f"{opt}: {e}") from None
    return _run_choice(setup, mode, choice, jitter, seed, bts, record, (cost, plan))


def _run_choice(setup: Scenario, mode: Mode, choice: Choice, jitter: float, seed: int, bts: BTSConfig | None,
                record: bool, built=None) -> ModeRun:
    """Simulate the chosen candidate (its stale hold searched) and report it as a ``ModeRun``."""
    split, het = choice.split, setup.testbed.heterogeneous
    cost, plan = built or _built(setup, mode, choice)
    plan = replace(plan, stale_hold=best_stale_hold(plan, cost, bts))
    res = simulate(plan, cost, jitter=jitter, seed=seed, bts=bts, record=record)
    copy = bool(choice.tag_copy if choice.tag_copy is not None else setup.workload.training.tag_copy)
    publish = choice.publish or setup.workload.training.publish
    groups = choice.shard_groups or setup.workload.training.shard_groups
    return ModeRun(mode, split, plan, res, note=split.label(het), tag_copy=copy and mode.tag,
                   publish=publish if mode.disaggregated else "",
                   shard_groups=groups if plan.shard_ranks > 1 or len(plan.trainers) < split.n_train else 1,
                   stale_hold=plan.stale_hold, gang_groups=plan.gang_groups)


__all__ = ["Choice", "ModeRun", "Scenario", "ScenarioError", "Split", "choose_split", "make_plan", "split_options", "run_mode"]
