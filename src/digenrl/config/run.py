"""The run's root section (``Config``: run_dir, seed, steps and every section) with its cross-key rules (one
home), and the eval and log sections."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from digenrl.models.specs import SEQUENCE_PARALLEL_FAMILIES
from digenrl.schedule.plan import Mode

from .base import _Strict
from .model import ModelConfig, SamplerConfig, TaskConfig
from .runtime import GeneratorConfig, RuntimeConfig
from .train import TrainConfig
from .tuning import TuningConfig


class EvalConfig(_Strict):
    every: int = Field(20, ge=0)  # 0 = only before and after training
    """Eval every N steps (ODE sampling of the eval prompts with the EMA weights); 0: only before and after training."""
    num_prompts: int = Field(64, ge=1)
    """Eval prompts (at most those the eval set has; the run warns when it has fewer)."""
    grid_prompts: int = Field(8, ge=1)
    """Samples in each eval's grid (`samples_before.png`, `samples/eval_step_N.png`, `samples_after.png`)."""
    guard: dict[str, dict[str, Any]] = {}  # {name: {options}} (observe.hacking_guard)
    """Reward-hacking guard: rewards (as in `reward`, no weight) and `drift` (image statistics against the base model's
    samples) scored on every eval's samples, never optimised; in every mode (the run waits for each eval).
    """
    guard_action: Literal["none", "warn", "checkpoint", "stop"] = "warn"  # when a guard falls while eval rises
    """When a guard falls by more than its tolerance while the eval reward rises: `none`, `warn`, `checkpoint` (keep
    the last weights before) or `stop` (exit 3).
    """
    guard_tolerance: float = Field(0.1, gt=0.0)  # the fall that trips a guard: relative to its first value
    """The fall, relative to a guard's first value, that trips it (an entry's own `tolerance` wins)."""

    @field_validator("guard", mode="before")
    @classmethod
    def _guard_shorthand(cls, value: Any) -> Any:
        """``{drift: null}`` means ``{drift: {}}``."""
        return {k: ({} if v is None else v) for k, v in value.items()} if isinstance(value, dict) else value


class LogConfig(_Strict):
    tensorboard: bool = False
    """Write every row's scalars and the sample grids to `run_dir/tensorboard` (needs the tensorboard package)."""
    wandb: bool = False
    """Log to wandb (needs the wandb package; `WANDB_MODE=offline` needs no account)."""
    wandb_project: str = "digenrl"
    """The wandb project."""
    progress: bool = True
    """Progress on stderr: start-up, model load, calibration and eval phases, and the colocated loop's bar."""
    print_every: int = Field(1, ge=0)  # one readable line per N steps on stdout (reward, parts, eval, kl, speed); 0: none
    """One line per N steps on stdout (reward and its parts, eval, KL, speed); 0: none."""


class Config(_Strict):
    run_dir: str = "runs/demo"
    """Where the run's outputs go; a directory holding a previous run is refused without `--resume` / `--overwrite`;
    empty, `.`, `/` and the home directory are refused.
    """
    resume: Literal["never", "auto"] = "never"  # auto: continue from run_dir's newest checkpoint if it has one
    """`auto`: continue from `run_dir`'s newest resumable checkpoint if it has one (else start); `never`: start."""
    seed: int = 0
    """The run seed: the prompts of each step and every trajectory's noise derive from it."""
    steps: int = Field(200, ge=0)
    """RL steps (one weight publish each)."""
    model: ModelConfig = ModelConfig()
    """The policy (`model.*`)."""
    task: TaskConfig = TaskConfig()
    """The prompts (`task.*`)."""
    reward: dict[str, dict[str, Any]] = {"digits": {"weight": 1.0}}  # {name: {weight: w, ...}}; {name: w} for short
    """Weighted sum of rewards: `{name: {weight: w, option: value}}`; `{name: w}` and `reward=name` for short; built-in
    names, entry points of group `digenrl.rewards` or `module:function` factories.
    """
    sampler: SamplerConfig = SamplerConfig()
    """Sampling (`sampler.*`)."""
    train: TrainConfig = TrainConfig()
    """Training (`train.*`)."""
    eval: EvalConfig = EvalConfig()
    """Evaluation (`eval.*`)."""
    runtime: RuntimeConfig = RuntimeConfig()
    """Execution (`runtime.*`)."""
    generator: GeneratorConfig = GeneratorConfig()
    """The generator pool's inference copy (`generator.*`)."""
    log: LogConfig = LogConfig()
    """Logging (`log.*`)."""
    tuning: TuningConfig = TuningConfig()
    """The planner's outputs and tuning knobs a user rarely sets (`tuning.*`)."""

    def fragment_generations(self) -> int:
        """Generations per fragment a run cuts: ``min(runtime.fragment_size, train.generations)`` (a group's last
        fragment is smaller where f does not divide G). The plan, the memory checks and ``digenrl check`` read it."""
        return min(self.runtime.fragment_size, self.train.generations)

    def bts_config(self):
        """The scheduler's ``BTSConfig`` for ``runtime.tag_policy`` and ``tuning.bts`` (pass it as
        ``Scheduler(bts_config=...)``)."""
        from digenrl.schedule.bts import BTSConfig

        return BTSConfig(**self.tuning.bts.model_dump(), policy=self.runtime.tag_policy)  # BTSConfig's field names

    @field_validator("reward", mode="before")
    @classmethod
    def _reward_shorthand(cls, value: Any) -> Any:
        """``{pickscore: 0.5}`` (Flow-GRPO's ``reward_fn``) means ``{pickscore: {weight: 0.5}}``; ``{ocr: null}``
        means ``{ocr: {}}`` (weight 1)."""
        if isinstance(value, str):  # reward=pickscore: that one reward, weight 1
            return {value: {}}
        if isinstance(value, list) and all(isinstance(v, str) for v in value):  # reward=[ocr, pickscore]
            return {v: {} for v in value}
        if not isinstance(value, dict):
            return value
        return {k: ({"weight": v} if isinstance(v, (int, float)) and not isinstance(v, bool) else {} if v is None else v)
                for k, v in value.items()}

    @model_validator(mode="after")
    def _check(self) -> "Config":
        if not self.reward:
            raise ValueError("reward: at least one reward is required")
        t = self.train
        if t.minibatch_split == "generations" and t.minibatches_per_step > t.generations:
            raise ValueError(f"train.minibatches_per_step {t.minibatches_per_step} exceeds train.generations "
                             f"{t.generations}: with train.minibatch_split=generations a minibatch takes a block of "
                             "every group's generations")
        if t.minibatch_split != "generations" and t.minibatches_per_step > t.prompts_per_step:
            raise ValueError(f"train.minibatches_per_step {t.minibatches_per_step} exceeds train.prompts_per_step "
                             f"{t.prompts_per_step}: a minibatch is a set of whole prompt groups")
        self._check_algorithm_options()
        if t.best_of_n is not None and (t.best_of_n % 2 or t.best_of_n > t.generations):
            raise ValueError(f"train.best_of_n {t.best_of_n} must be even and at most train.generations {t.generations}")
        if t.algorithm == "grpo_guard" and self.sampler.kind == "cps":
            raise ValueError("train.algorithm: grpo_guard normalises a Gaussian transition's ratio (sampler.kind "
                             "flow_grpo or dance); cps's log-prob is a constant-free surrogate")
        if t.algorithm == "grpo_guard" and t.step_wide \
                and Mode(self.runtime.mode).pipelined:
            raise ValueError("train.algorithm: grpo_guard with step-wide statistics (train.std_mode=global or "
                             "train.adv_baseline=batch) runs in runtime.mode colocated or naive only (the pipelined "
                             "modes' deferred rescaling does not carry its per-timestep reweighting yet)")
        if t.algorithm == "mixgrpo":
            if t.timestep_strategy != "fraction" or t.window_range is not None:
                key = "train.window_range" if t.window_range is not None else "train.timestep_strategy"
                raise ValueError(f"{key}: train.algorithm=mixgrpo moves its own SDE window (train.window_size, "
                                 f"train.window_shift_interval, train.window_stride); leave {key} unset")
            if self.sampler.post_compress_ratio < 1.0 and self.sampler.static_shift is None:
                raise ValueError("sampler.post_compress_ratio: MixGRPO-Flash rebuilds MixGRPO's static-shift schedule "
                                 "after the window; set sampler.static_shift (MixGRPO's FLUX recipe: 3)")
            if not 1 <= t.window_size <= self.sampler.num_steps - 2:
                raise ValueError(f"train.window_size: {t.window_size} does not fit MixGRPO's window range "
                                 f"[0, sampler.num_steps - 2) = [0, {self.sampler.num_steps - 2})")
        elif t.algorithm == "nft":
            self._check_nft()
        if t.algorithm != "nft" and t.nft_timesteps is not None:
            raise ValueError("train.nft_timesteps: DiffusionNFT's training timesteps need train.algorithm=nft")
        for key in ("nft_old_policy", "nft_old_decay", "nft_beta"):  # a value other than the default (a worker's
            if t.algorithm != "nft" and getattr(t, key) != type(t).model_fields[key].default:  # config sets all)
                raise ValueError(f"train.{key}: DiffusionNFT's old policy needs train.algorithm=nft")
        if t.algorithm != "nft" and self.sampler.nft_solver != "dpmpp_2m":
            raise ValueError("sampler.nft_solver: DiffusionNFT's sampler needs train.algorithm=nft")
        if t.algorithm != "mixgrpo" and (self.sampler.post_solver != "euler" or self.sampler.post_compress_ratio < 1.0):
            key = "sampler.post_solver" if self.sampler.post_solver != "euler" else "sampler.post_compress_ratio"
            raise ValueError(f"{key}: the ODE after the SDE window (MixGRPO-Flash) needs train.algorithm=mixgrpo")
        self._check_runtime()
        self._check_quirks()
        self._check_generator()
        if self.train.cpu_offload and self.train.sharding != "fsdp":
            raise ValueError("train.cpu_offload: needs train.sharding=fsdp (FSDP2 offloads the sharded state)")
        k = self.train.shard_groups
        if k > 1 and self.train.sharding != "fsdp":
            raise ValueError(f"train.shard_groups: {k} shard groups (hybrid sharding) need train.sharding=fsdp")
        if self.runtime.trainers % k:
            raise ValueError(f"train.shard_groups: {k} does not divide runtime.trainers {self.runtime.trainers} "
                             "(every shard group has the same number of ranks)")
        self._check_sequence_parallel()
        return self

    def _check_sequence_parallel(self) -> None:
        """train.sequence_parallel, runtime.generator_sequence_parallel: a family with a plan, Ulysses only, and a
        degree that divides the ranks it groups (the heads and the tokens: ``validate.check_model``, from the model
        directory's configs)."""
        t, rt = self.train, self.runtime
        for key, sp in (("train.sequence_parallel", t.sequence_parallel),
                        ("runtime.generator_sequence_parallel", rt.generator_sequence_parallel)):
            if sp.degree == 1:
                continue
            if sp.ring > 1:
                raise ValueError(f"{key}.ring: {sp.ring}: ring attention needs an attention kernel that returns the "
                                 "log-sum-exp (diffusers' flash / cuDNN backends), not the native one DigenRL runs; "
                                 f"use {key}.ulysses (docs/sequence_parallel.md)")
            if self.model.kind not in SEQUENCE_PARALLEL_FAMILIES:
                raise ValueError(f"{key}: model.kind {self.model.kind!r} has no sequence-parallel plan (supported: "
                                 f"{', '.join(sorted(SEQUENCE_PARALLEL_FAMILIES))}; docs/sequence_parallel.md)")
        d = t.sequence_parallel.degree
        group = rt.trainers // t.shard_groups if t.sharding == "fsdp" else rt.trainers
        where = "each shard group's runtime.trainers / train.shard_groups" if t.sharding == "fsdp" else "runtime.trainers"
        if group % d:
            raise ValueError(f"train.sequence_parallel: degree {d} does not divide {where} = {group} (a "
                             "sequence-parallel group is d consecutive trainer ranks)")
        g = rt.generator_sequence_parallel.degree
        if g > 1 and Mode(rt.mode) is Mode.COLOCATED:
            raise ValueError("runtime.generator_sequence_parallel: colocated mode has no generators (its workers "
                             "generate with train.sequence_parallel)")

    def _check_runtime(self) -> None:
        """Keys of ``runtime`` against the rest (the one home of these cross-key rules: ``control.run_plan`` builds
        the plan of a config that passed them)."""
        rt, t = self.runtime, self.train
        mode = Mode(rt.mode)
        if t.adv_per_reward and t.step_wide and mode.pipelined:
            raise ValueError(f"train.adv_per_reward: per-reward advantages with step-wide statistics (std_mode=global "
                             f"or adv_baseline=batch) need every reward of the step before the first training cell: "
                             f"runtime.mode colocated or naive only (got {rt.mode})")
        if mode.tag and rt.calibration.when == "never" and rt.profile is None:
            raise ValueError(f"runtime.calibration.when: 'never' leaves mode {mode.value!r} without a cost model (BTS "
                             "predicts with it): give runtime.profile or let the run measure one ('auto')")

    def _check_algorithm_options(self) -> None:
        """train.reward_aggregation, train.guard_bias, sampler.integer_timesteps=sampling: refused where unused."""
        t = self.train
        if t.reward_aggregation is not None and not t.adv_per_reward:
            raise ValueError(f"train.reward_aggregation: {t.reward_aggregation} aggregates per-reward advantages; it "
                             "needs train.adv_per_reward=true (else the weighted reward is normalised as one)")
        if t.guard_bias != "batch" and t.algorithm != "grpo_guard":
            raise ValueError("train.guard_bias: GRPO-Guard's RatioNorm bias needs train.algorithm=grpo_guard")
        if self.sampler.integer_timesteps == "sampling" and t.algorithm != "nft":
            raise ValueError("sampler.integer_timesteps: 'sampling' (integer time while sampling, float in training: "
                             "DiffusionNFT) needs train.algorithm=nft; a ratio algorithm recomputes the behaviour "
                             "log-prob in training, which must see the sampler's time (true or false)")

    def _check_nft(self) -> None:
        """train.algorithm=nft (DiffusionNFT, ``algo.nft``): ODE sampling, its own timestep draw, no ratio."""
        t, s = self.train, self.sampler
        if t.nft_timesteps is not None and t.nft_timesteps > s.num_steps:
            raise ValueError(f"train.nft_timesteps: {t.nft_timesteps} exceeds sampler.num_steps {s.num_steps} (each "
                             "sample's training timesteps are distinct points of its sampling schedule)")
        flat, rate, cap = t.nft_old_decay
        if flat < 0 or rate < 0 or not 0.0 <= cap < 1.0:
            raise ValueError(f"train.nft_old_decay: {list(t.nft_old_decay)} needs flat >= 0, rate >= 0 and 0 <= cap < 1 "
                             "(d_n = min(rate (n - flat), cap), train/nft_old.py)")
        if t.nft_old_policy == "current" and t.nft_old_decay != type(t).model_fields["nft_old_decay"].default:
            raise ValueError("train.nft_old_decay: the soft update's schedule needs train.nft_old_policy=soft")
        unused = {"train.clip_range": "no ratio to clip", "train.clip_range_low": "no ratio to clip",
                  "train.clip_range_high": "no ratio to clip", "train.kl_form": "its KL is a velocity MSE",
                  "train.timestep_strategy": "it draws its own timesteps (train.nft_timesteps)",
                  "train.timestep_fraction": "it draws its own timesteps (train.nft_timesteps)",
                  "train.window_size": "it samples with the ODE", "train.window_range": "it samples with the ODE",
                  "train.cfg_in_training": "its training is CFG-free", "train.cfg_detach_uncond": "its training "
                  "is CFG-free", "train.adv_per_reward": "one optimality r per sample",
                  "sampler.kind": "it samples with the ODE", "sampler.noise_level": "it samples with the ODE"}
        for key, why in unused.items():
            table, name = key.split(".")
            model = getattr(self, table)
            if name in model.model_fields_set and getattr(model, name) != type(model).model_fields[name].default:
                raise ValueError(f"{key}: train.algorithm=nft does not use it ({why}); leave it unset")

    def _check_generator(self) -> None:
        """The ``generator`` section and the behaviour log-prob options (docs/fast_generator.md)."""
        g, t = self.generator, self.train
        changed = [k for k in type(g).model_fields if getattr(g, k) != type(g).model_fields[k].default]
        if changed and self.runtime.mode == "colocated":
            raise ValueError(f"generator.{changed[0]}: runtime.mode=colocated has no generator pool (every worker "
                             "generates with its training weights); the generator options apply to the "
                             "disaggregated modes (naive, gap, gap_tsp, gap_tsp_tag, full)")
        if g.merge_lora and not (self.model.lora.enabled or self.model.lora_path):
            raise ValueError("generator.merge_lora: needs LoRA adapters to merge (model.lora.enabled=true or "
                             "model.lora_path)")
        if g.compile != "none" and self.runtime.generator_sequence_parallel.degree > 1:
            raise ValueError(f"generator.compile: {g.compile} is not supported with "
                             "runtime.generator_sequence_parallel > 1 (the sequence-parallel hooks and the compiled "
                             "graph were not tested together); set generator.compile=none")
        if t.old_logprob == "recompute" and t.algorithm in ("grpo_guard", "nft"):
            why = ("its ratio normalisation uses the generator's recorded transition means" if t.algorithm ==
                   "grpo_guard" else "DiffusionNFT records no log-probs")
            raise ValueError(f"train.old_logprob: recompute is not supported with train.algorithm={t.algorithm} "
                             f"({why})")
        if t.tis_cap is not None and t.old_logprob != "recompute":
            raise ValueError("train.tis_cap: the truncated importance weight min(exp(logp_old - logp_gen), cap) needs "
                             "train.old_logprob=recompute (with the generator's log-probs as logp_old it is 1)")

    def _check_quirks(self) -> None:
        """train.micro_batch, ema_update, zero_adv_refill, minibatch_split (Flow-GRPO's quirks)."""
        t, rt = self.train, self.runtime
        B = t.prompts_per_step * t.generations
        users = [k for k, on in (("train.ema_update=per_micro_batch", t.ema_update == "per_micro_batch"),
                                 ("train.zero_adv_refill", t.zero_adv_refill)) if on]
        if users and t.micro_batch is None:
            raise ValueError(f"train.micro_batch: {users[0]} counts Flow-GRPO micro-batches; set train.micro_batch "
                             "to its samples per micro-batch (Flow-GRPO sample.train_batch_size x GPUs)")
        if users and B % t.micro_batch:  # unused (the options off) it is only a note, e.g. in a shrunk preset
            raise ValueError(f"train.micro_batch: {t.micro_batch} does not divide the step's P x G = {B} samples "
                             f"({users[0]} counts micro-batches per step)")
        if t.ema_update == "per_micro_batch" and (B // t.micro_batch) % t.minibatches_per_step:
            raise ValueError(f"train.ema_update: per_micro_batch needs the step's {B // t.micro_batch} micro-batches "
                             f"(P G / train.micro_batch) to split evenly over train.minibatches_per_step = "
                             f"{t.minibatches_per_step} optimizer steps")
        if t.zero_adv_refill and not t.filter_zero_advantage:
            raise ValueError("train.zero_adv_refill: re-adds filtered samples; needs train.filter_zero_advantage=true")
        if t.zero_adv_refill and Mode(rt.mode).pipelined:
            raise ValueError(f"train.zero_adv_refill: the re-added samples are drawn from the whole step's "
                             f"zero-advantage samples, so a group cannot train before the step's last reward: "
                             f"runtime.mode colocated or naive only (got {rt.mode})")
        if t.minibatch_split == "samples" and Mode(rt.mode).pipelined:
            raise ValueError(f"train.minibatch_split: samples puts every prompt group in every minibatch, so a "
                             f"minibatch needs the whole step's rewards before its first training cell: "
                             f"runtime.mode colocated or naive only (got {rt.mode})")
