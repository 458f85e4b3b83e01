"""From a validated ``Config`` to what the runtime needs: the step plan and the worker ids.

Rules checked here (``ConfigError`` naming the key, before anything is written or started):

* ``train.std_mode = global`` needs every reward of the step before any advantage: only the barrier modes
  (``colocated``, ``naive``) support it; pipelined modes refuse it.
* ``colocated`` uses ``runtime.trainers`` workers that both generate and train; ``runtime.generators`` must
  stay 1 (it is not used).
* ``runtime.fragment_size`` larger than ``train.generations`` is clipped to G (one fragment per group).
* ``runtime.inject_failure`` must look like ``<worker>@<step>`` or ``<worker>@<step>:exit`` with a known worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from digenrl.config import Config, ConfigError
from digenrl.schedule import Mode, StepPlan


@dataclass(frozen=True)
class FailureHook:
    """Test hook: ``worker`` fails when it is handed work of ``step`` (raise, or exit the process)."""

    worker: str
    step: int
    exit: bool = False


@dataclass(frozen=True)
class RuntimeSetup:
    cfg: Config
    plan: StepPlan
    trained_timesteps: int  # S
    failure: FailureHook | None = None
    profile: object | None = None  # ProfileCost from runtime.profile (else measured at start in TAG modes)

    @property
    def generator_ids(self) -> tuple[str, ...]:
        return self.plan.generators

    @property
    def trainer_ids(self) -> tuple[str, ...]:
        return self.plan.trainers


def worker_ids(cfg: Config) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(generator ids, trainer ids). Colocated workers are named ``col<i>`` and listed as trainers."""
    rt = cfg.runtime
    if rt.mode == "colocated":
        return (), tuple(f"col{i}" for i in range(rt.trainers))
    return tuple(f"gen{i}" for i in range(rt.generators)), tuple(f"trn{i}" for i in range(rt.trainers))


def runtime_plan(cfg: Config) -> RuntimeSetup:
    from digenrl.train.context import timestep_plan

    rt, t = cfg.runtime, cfg.train
    mode = Mode(rt.mode)
    if t.std_mode == "global" and mode.pipelined:
        raise ConfigError(f"train.std_mode: 'global' needs the whole step's rewards before any training, which "
                          f"the pipelined mode {rt.mode!r} does not wait for; use train.std_mode=group or "
                          f"runtime.mode=naive/colocated")
    if mode is Mode.COLOCATED and rt.generators != 1:
        raise ConfigError("runtime.generators: colocated mode runs runtime.trainers workers that both generate "
                          "and train; leave runtime.generators at 1")
    S = len(timestep_plan(cfg, 0).trained)
    if S < 1:
        raise ConfigError("train.timestep_fraction: no trained timestep (nothing to train)")
    gens, trainers = worker_ids(cfg)
    plan = StepPlan(
        prompts=t.prompts_per_step, generations=t.generations,
        fragment_size=min(rt.fragment_size, t.generations), trained_timesteps=S,
        sampling_steps=cfg.sampler.num_steps, chunk_generations=t.chunk_generations,
        chunk_timesteps=t.chunk_timesteps, generators=gens, trainers=trainers, mode=mode, steps=cfg.steps,
        max_stale_fraction=rt.max_stale_fraction,
    )
    profile = None
    if rt.profile is not None:
        from digenrl.sim.profile import ProfileError, load_profile

        try:
            profile = load_profile(rt.profile)
        except ProfileError as e:
            raise ConfigError(f"runtime.profile: {e}") from None
    return RuntimeSetup(cfg, plan, S, parse_failure(rt.inject_failure, gens + trainers), profile)


def parse_failure(spec: str | None, workers: tuple[str, ...]) -> FailureHook | None:
    if spec is None:
        return None
    head, _, kind = spec.partition(":")
    worker, _, step = head.partition("@")
    if worker not in workers or not step.isdigit() or kind not in ("", "exit", "raise"):
        raise ConfigError(f"runtime.inject_failure: expected '<worker>@<step>[:exit]' with a worker among "
                          f"{', '.join(workers)} (got {spec!r})")
    return FailureHook(worker, int(step), kind == "exit")
