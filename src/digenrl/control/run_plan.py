"""From a validated ``Config`` to the run plan both executors run: the ``StepPlan`` and the worker ids.

Pure (no torch, no ray): the Ray runtime executes this plan, and ``digenrl simulate --config`` prices exactly
the same plan without loading torch. The cross-key rules of the config are ``config.Config``'s (one home); what
needs the plan itself is checked here (``ConfigError`` naming the key, before anything is written or started):
``runtime.generators`` must stay 1 in colocated mode (each of ``runtime.trainers`` workers generates and trains
its share, ``StepPlan.packed``), at least one trained timestep, the test hooks (``TestHooks``). The plan also
carries: ``step_wide`` (``train.std_mode = global`` or ``adv_baseline = batch``: the scheduler holds every commit
until the step's last group is rewarded, ``algo.deferred_std``), the rounds (``train.minibatches_per_step`` x
``inner_epochs`` commits per step), ``sample_split`` (``train.minibatch_split = samples | generations``: every
round plans every group and trains the round's samples) and ``runtime.fragment_size`` clipped to G.

Sharded trainer pool (``train.sharding: fsdp``, docs/architecture.md): the scheduler sees one trainer per shard
group (``shard0`` ... ``shard<k-1>`` for ``train.shard_groups`` = k), and every action of it is a collective the
executor runs on the group's ranks (``RunPlan.ranks_of``); TSP spreads chunks over shard groups, not ranks.
Sequence-parallel pool (``train.sequence_parallel`` = d > 1, docs/sequence_parallel.md): d consecutive ranks
are one trainer ``sp<i>`` unless FSDP already groups them (``StepPlan.shard_ranks`` counts lanes,
``StepPlan.sequence_parallel`` the ranks of a lane); a sequence-parallel generator
(``runtime.generator_sequence_parallel`` = d) is one ``gen<i>`` run by d actors ``gen<i>.<j>``
(``RunPlan.gen_groups``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from digenrl.algo.timesteps import TimestepPlan, nft_plan, select_timesteps
from digenrl.config import Config, ConfigError
from digenrl.schedule import CostModel, Mode, StepPlan

from .profile import ProfileError, load_profile


HOOK_PHASES = ("startup", "calibrate", "eval", "checkpoint")  # inject_failure outside a step's work
HOOKS_ENV = "DIGENRL_TEST_HOOKS"


@dataclass(frozen=True)
class TestHooks:
    """Faults a test injects into a run. They are not config keys (a user's schema holds none): the process that
    plans the run reads them from the environment variable ``DIGENRL_TEST_HOOKS``, ``;``-separated
    ``key=value`` pairs (``read_hooks``), and the controller hands them to the workers (both transports):

    * ``inject_failure=<worker>@<step>[:exit|:stall]``: ``worker`` fails when it is first handed work of ``step``
      (numbered from 1, as the progress line and the failure message: ``schedule.step_number``; kept so in
      ``step``), or (``step`` one of ``HOOK_PHASES``) at the end of its construction, when the calibration
      starts, at its first eval or its first resumable checkpoint; on the run's first attempt only: ``raise`` an
      error (default), ``exit`` the process (the actor dies) or ``stall`` (the process stops itself with SIGSTOP
      and never answers);
    * ``logprob_offset=<x>``: added to every log-prob the generator pool records (a biased generator, as
      verl-omni PR 279's +5e-3).
    """

    __test__ = False  # not a pytest class

    worker: str | None = None
    step: int | str = -1
    kind: str = "raise"
    logprob_offset: float = 0.0

    @property
    def fails(self) -> bool:
        return self.worker is not None

    def without_failure(self) -> "TestHooks":
        """The hooks of a restarted attempt: the failure fired once."""
        return replace(self, worker=None, step=-1, kind="raise")


def read_hooks(workers: tuple[str, ...]) -> TestHooks | None:
    """``DIGENRL_TEST_HOOKS`` parsed (``TestHooks``); None when unset or empty."""
    text = os.environ.get(HOOKS_ENV, "")
    if not text.strip():
        return None
    hooks = TestHooks()
    for item in filter(None, (x.strip() for x in text.split(";"))):
        key, eq, value = item.partition("=")
        if key == "inject_failure" and eq:
            head, _, kind = value.partition(":")
            worker, _, step = head.partition("@")
            named = (step.isdigit() and int(step) >= 1) or step in HOOK_PHASES  # steps from 1
            if worker not in workers or not named or kind not in ("", "exit", "raise", "stall"):
                raise ConfigError(f"{HOOKS_ENV}: inject_failure expects '<worker>@<step from 1 or "
                                  f"{'|'.join(HOOK_PHASES)}>[:exit|:stall]' with a worker among {', '.join(workers)} "
                                  f"(got {value!r})")
            hooks = replace(hooks, worker=worker, step=int(step) if step.isdigit() else step, kind=kind or "raise")
        elif key == "logprob_offset" and eq:
            try:
                hooks = replace(hooks, logprob_offset=float(value))
            except ValueError:
                raise ConfigError(f"{HOOKS_ENV}: logprob_offset expects a number (got {value!r})") from None
        else:
            raise ConfigError(f"{HOOKS_ENV}: unknown test hook {item!r} (known: inject_failure=..., "
                              "logprob_offset=...)")
    return hooks


@dataclass(frozen=True)
class RunPlan:
    """What a run of ``cfg`` executes: the scheduler's plan, S, the test hooks and a given cost profile."""

    cfg: Config
    plan: StepPlan
    trained_timesteps: int  # S
    hooks: TestHooks | None = None  # DIGENRL_TEST_HOOKS (``read_hooks``)
    profile: CostModel | None = None  # ``runtime.profile`` loaded (else measured at start in TAG modes)
    shards: dict[str, tuple[str, ...]] | None = None  # shard group id -> its rank ids (None: unsharded)
    gen_groups: dict[str, tuple[str, ...]] | None = None  # generator id -> its ranks' ids (sequence-parallel
    # generators, ``runtime.generator_sequence_parallel``; None: one actor each)

    @property
    def generator_ids(self) -> tuple[str, ...]:
        """The generator actor ids in order: one per generator, or ``gen<i>.<j>`` for the d ranks of each
        sequence-parallel generator ``gen<i>``."""
        if self.gen_groups is None:
            return self.plan.generators
        return tuple(r for g in self.plan.generators for r in self.gen_groups[g])

    @property
    def trainer_ids(self) -> tuple[str, ...]:
        """The trainer (or colocated) rank ids, one actor each, in rank order."""
        if self.shards is None:
            return self.plan.trainers
        return tuple(r for t in self.plan.trainers for r in self.shards[t])

    @property
    def grouped(self) -> bool:
        """Each trainer id stands for a group of ranks (a shard group or a sequence-parallel group)."""
        return self.shards is not None

    @property
    def sequence_parallel(self) -> int:
        """Ranks per data-parallel lane of a trainer id (``train.sequence_parallel``)."""
        return self.cfg.train.sequence_parallel.degree

    def ranks_of(self, worker: str) -> tuple[str, ...]:
        """The ranks that run an action of the scheduler's ``worker`` (itself when not grouped)."""
        if self.gen_groups is not None and worker in self.gen_groups:
            return self.gen_groups[worker]
        return (worker,) if self.shards is None or worker not in self.shards else self.shards[worker]


def worker_ids(mode: Mode | str, generators: int, trainers: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(generator ids, trainer ids): ``gen<i>`` / ``trn<i>``; colocated workers are ``col<i>``, listed as
    trainers (they generate and train). The one naming of workers, for the runtime and the simulator."""
    if Mode(mode) is Mode.COLOCATED:
        return (), tuple(f"col{i}" for i in range(trainers))
    return tuple(f"gen{i}" for i in range(generators)), tuple(f"trn{i}" for i in range(trainers))


def shard_groups(ranks: tuple[str, ...], sharded: bool, groups: int = 1) -> tuple[tuple[str, ...], dict[str, tuple[str, ...]] | None]:
    """(the scheduler's trainer ids, shard group -> rank ids): ``groups`` shard groups ``shard<i>`` of
    len(ranks) / groups consecutive ranks each when ``sharded`` (``groups`` > 1: hybrid sharding, each group a
    data-parallel replica of the others), else the ranks themselves."""
    if not sharded:
        return ranks, None
    if groups < 1 or len(ranks) % groups:
        raise ValueError(f"{len(ranks)} trainer ranks do not split into {groups} equal shard groups")
    return _blocks(ranks, len(ranks) // groups, "shard")


def _blocks(ranks: tuple[str, ...], size: int, prefix: str) -> tuple[tuple[str, ...], dict[str, tuple[str, ...]]]:
    """(ids ``<prefix><i>``, id -> its ``size`` consecutive ranks) of ``ranks`` cut into blocks of ``size``."""
    ids = tuple(f"{prefix}{i}" for i in range(len(ranks) // size))
    return ids, {g: ranks[i * size:(i + 1) * size] for i, g in enumerate(ids)}


def rank_groups(ranks: tuple[str, ...], sharded: bool, groups: int = 1,
                sequence: int = 1) -> tuple[tuple[str, ...], dict[str, tuple[str, ...]] | None]:
    """(the scheduler's trainer ids, trainer id -> rank ids): the shard groups of ``shard_groups`` when
    ``sharded`` (each holds its sequence-parallel lanes), else groups ``sp<i>`` of ``sequence`` consecutive ranks
    when ``sequence`` > 1, else the ranks themselves."""
    if sharded or sequence == 1:
        return shard_groups(ranks, sharded, groups)
    if len(ranks) % sequence:
        raise ValueError(f"{len(ranks)} trainer ranks do not split into sequence-parallel groups of {sequence}")
    return _blocks(ranks, sequence, "sp")


def generator_groups(gens: tuple[str, ...], sequence: int) -> dict[str, tuple[str, ...]] | None:
    """Generator id -> its ranks' actor ids ``gen<i>.<j>``, j < ``sequence`` (None when ``sequence`` is 1)."""
    if sequence == 1:
        return None
    return {g: tuple(f"{g}.{j}" for j in range(sequence)) for g in gens}


def grad_sum_fp64(cfg) -> bool:
    """``train.grad_sum`` in effect: ``auto`` is fp64 where a round's chunks go to whichever of several trainers is
    free (a TSP mode with more than one scheduler trainer: replicated ranks or sequence-parallel lanes, or shard
    groups under FSDP), the case whose float32 sums depend on timing; one trainer keeps the float32 order."""
    t, rt = cfg.train, cfg.runtime
    if t.grad_sum != "auto":
        return t.grad_sum == "fp64"
    trainers = t.shard_groups if t.sharding == "fsdp" else rt.trainers // t.sequence_parallel.degree
    return Mode(rt.mode).tsp and trainers > 1


def timestep_plan(cfg: Config, step: int) -> TimestepPlan:
    """SDE and trained denoising steps of ``step`` (``algo.timesteps.select_timesteps`` with the config's keys)."""
    t = cfg.train
    if t.algorithm == "nft":  # DiffusionNFT: ODE sampling, K training slots per sample (S = K)
        return nft_plan(cfg.sampler.num_steps, t.nft_timesteps)
    strategy = "mixgrpo" if t.algorithm == "mixgrpo" else t.timestep_strategy  # MixGRPO's moving window
    return select_timesteps(cfg.sampler.num_steps, strategy=strategy, fraction=t.timestep_fraction,
                            window_size=t.window_size, window_range=t.window_range, seed=cfg.seed, step=step,
                            sde_kind=cfg.sampler.kind, shift_interval=t.window_shift_interval,
                            stride=t.window_stride)


def plan_run(cfg: Config) -> RunPlan:
    rt, t = cfg.runtime, cfg.train
    mode = Mode(rt.mode)
    if mode is Mode.COLOCATED and rt.generators != 1:  # (a config may describe pools for other modes: `simulate`)
        raise ConfigError("runtime.generators: colocated mode runs runtime.trainers workers that both generate "
                          "and train; leave runtime.generators at 1")
    try:
        S = len(timestep_plan(cfg, 0).trained)
    except ValueError as e:
        raise ConfigError(f"train.timestep_strategy: {e}") from None
    if S < 1:
        raise ConfigError("train.timestep_fraction: no trained timestep (nothing to train)")
    gens, ranks = worker_ids(mode, rt.generators, rt.trainers)
    d = t.sequence_parallel.degree
    trainers, shards = rank_groups(ranks, t.sharding == "fsdp", t.shard_groups, d)
    lanes = len(ranks) // t.shard_groups // d if t.sharding == "fsdp" else 1
    plan = StepPlan(
        prompts=t.prompts_per_step, generations=t.generations,
        fragment_size=cfg.fragment_generations(), trained_timesteps=S,
        sampling_steps=cfg.sampler.num_steps, chunk_generations=t.chunk_generations,
        chunk_timesteps=t.chunk_timesteps, generators=gens, trainers=trainers, mode=mode, steps=cfg.steps,
        max_stale_fraction=rt.max_stale_fraction, minibatches=t.minibatches_per_step, epochs=t.inner_epochs,
        shard_ranks=lanes, sequence_parallel=d, step_wide=t.step_wide,
        publish_joins=mode.disaggregated and rt.publish in ("broadcast", "stream"),
        publish_streams=mode.disaggregated and rt.publish == "stream",
        sample_split=t.minibatch_split in ("samples", "generations"), stale_hold=cfg.tuning.stale_hold,
        gang_groups=cfg.tuning.gang_groups, generator_sequence_parallel=rt.generator_sequence_parallel.degree,
        packed=mode is Mode.COLOCATED, sample_batch=cfg.sampler.batch_size,
    )
    profile = None
    if rt.profile is not None:
        try:
            profile = load_profile(rt.profile)
        except ProfileError as e:
            raise ConfigError(f"runtime.profile: {e}") from None
    run = RunPlan(cfg, plan, S, None, profile, shards, generator_groups(gens, rt.generator_sequence_parallel.degree))
    return replace(run, hooks=read_hooks(run.generator_ids + run.trainer_ids))
