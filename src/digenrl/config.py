"""Typed run configuration: YAML file + dotted ``key=value`` overrides, validated by pydantic.

Every table forbids unknown keys, so a typo is refused with the offending dotted key and the expected type
(``ConfigError``; the CLI turns it into exit code 2 before anything is written).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from digenrl.schedule.plan import Mode


class ConfigError(ValueError):
    """A configuration problem; the message names the key (or file) and what was expected."""


class _NoAliasLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses aliases (``*name``) while composing, before anything is expanded: a few
    hundred bytes of nested aliases (an alias bomb) would otherwise become 10^9 leaves during validation."""

    def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, f"YAML alias *{event.anchor} is not allowed in a config "
                                              "(write the value out)", event.start_mark)
        return super().compose_node(parent, index)


class _NoAliasDumper(yaml.SafeDumper):
    """Writes an object seen twice out twice, never as an anchor + alias (so this program reads its own files)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


MAX_CONFIG_BYTES = 1 << 20  # a run config is a few KiB; a bigger file is not one


def safe_yaml_load(text: str) -> Any:
    """``yaml.safe_load`` without aliases; raises ``yaml.YAMLError`` (its message names the line)."""
    return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 (a SafeLoader subclass)


class _Strict(BaseModel):
    # every float must be finite: an inf lr / noise level or a NaN max_grad_norm would train every weight to NaN
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class LoraConfig(_Strict):
    enabled: bool = False
    rank: int = Field(32, ge=1)
    alpha: float = Field(64.0, gt=0.0)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] | None = None  # None: the family's default (Flow-GRPO recipes)


class ModelConfig(_Strict):
    kind: str = "tiny_dit"
    path: str | None = None  # local diffusers directory / checkpoint; None = the built-in demo base weights
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    lora: LoraConfig = LoraConfig()
    prompt_cache_dir: str | None = None
    checkpoint: str | None = None  # trained weights (a run's checkpoint.safetensors) loaded over model.path's
    lora_path: str | None = None  # a LoRA adapter to train on: PEFT dir/file (flow_grpo's save_pretrained) or diffusers
    options: dict[str, Any] = {}  # family-specific extras (e.g. height/width/frames)


class TaskConfig(_Strict):
    name: str = "digits"
    prompts_file: str | None = None  # one prompt per line (real models), or a dataset dir (train.txt / test.txt)
    eval_prompts_file: str | None = None


class SamplerConfig(_Strict):
    num_steps: int = Field(10, ge=1)
    eval_num_steps: int | None = Field(None, ge=1)  # default: num_steps
    noise_level: float = Field(0.7, ge=0.0)
    kind: Literal["flow_grpo", "dance", "cps"] = "flow_grpo"
    cfg_scale: float = Field(1.0, ge=0.0)
    eval_cfg_scale: float | None = Field(None, ge=0.0)  # Flow-GRPO's sample.eval_guidance_scale; None = cfg_scale
    static_shift: float | None = Field(None, gt=0.0)  # DanceGRPO --shift: its schedule instead of the family's
    integer_timesteps: bool | Literal["sampling"] = False  # the model gets int(sigma * 1000) / 1000 (DanceGRPO's and
    # MixGRPO's timesteps, sampling and training); "sampling": only while sampling, float time in training (DiffusionNFT)
    same_latent: bool = False  # one initial noise per prompt group (Flow-GRPO same_latent, DanceGRPO init_same_noise)
    post_solver: Literal["euler", "dpmpp_2m"] = "euler"  # mixgrpo: ODE solver after the window (dpmpp_2m: MixGRPO-Flash)
    post_compress_ratio: float = Field(1.0, gt=0.0, le=1.0)  # mixgrpo: steps kept after the window (Flash: 0.4)
    nft_solver: Literal["dpmpp_2m", "euler"] = "dpmpp_2m"  # nft: its ODE (DiffusionNFT sample.solver="dpm2"; eval: Euler)


_Beta = Annotated[float, Field(ge=0.0, lt=1.0)]  # an AdamW beta


class TrainConfig(_Strict):
    prompts_per_step: int = Field(8, ge=1)  # P
    generations: int = Field(8, ge=2)  # G
    lr: float = Field(1e-4, gt=0.0)  # demo: 3e-4 peaked then oscillated (eval 0.97 -> 0.84); 1e-4 + EMA ends at its peak
    weight_decay: float = Field(0.0, ge=0.0)
    betas: tuple[_Beta, _Beta] = (0.9, 0.999)
    max_grad_norm: float | None = Field(1.0, gt=0.0)  # None: no clipping (the norm is still checked finite)
    adam_epsilon: float = Field(1e-8, gt=0.0)  # Flow-GRPO train.adam_epsilon
    clip_range: float = Field(0.2, gt=0.0)
    clip_range_low: float | None = Field(None, gt=0.0)  # asymmetric clip r >= 1 - low (Flow-GRPO clip_range_lt)
    clip_range_high: float | None = Field(None, gt=0.0)  # r <= 1 + high (clip_range_gt); None = clip_range
    adv_clip_max: float = Field(5.0, gt=0.0)
    std_mode: Literal["group", "global"] = "group"
    adv_baseline: Literal["group", "batch"] = "group"  # batch = Flow-GRPO per_prompt_stat_tracking=False
    adv_std_unbiased: bool = False  # True: DanceGRPO's torch std (n - 1)
    adv_eps: float = Field(1e-4, gt=0.0)  # Flow-GRPO 1e-4, DanceGRPO 1e-8
    adv_per_reward: bool = False  # normalise each reward part in its group (DanceGRPO vq/mq, MixGRPO advantage_aggr)
    reward_aggregation: Literal["advantages", "losses"] | None = None  # adv_per_reward: how the A_k enter the loss:
    # advantages = one clipped loss of clamp(sum_k w_k A_k, +-adv_clip_max) (MixGRPO), losses = sum_k w_k L(A_k)
    # (DanceGRPO); None: the algorithm's reference (mixgrpo: advantages, else losses)
    best_of_n: int | None = Field(None, ge=2)  # DanceGRPO --bestofn: train the n/2 best and n/2 worst of each group
    filter_zero_advantage: bool = True  # Flow-GRPO drops samples with advantage 0 (no loss, no KL, not counted)
    beta_kl: float = Field(0.0, ge=0.0)
    kl_form: Literal["flow_grpo", "exact"] = "flow_grpo"  # exact = Flow-GRPO's KL / (-dt)
    minibatches_per_step: int = Field(1, ge=1)  # M optimizer steps per step, groups split by index (docs/architecture.md, "Minibatches")
    inner_epochs: int = Field(1, ge=1)  # passes over the step's minibatches (Flow-GRPO num_inner_epochs)
    algorithm: Literal["flow_grpo", "grpo_guard", "mixgrpo", "nft"] = "flow_grpo"  # loss + sampler contract (README, "Algorithms")
    nft_timesteps: int | None = Field(None, ge=1)  # nft: training timesteps K per sample; None: int(0.99 T) (DiffusionNFT)
    nft_old_policy: Literal["soft", "current"] = "soft"  # nft: old = soft-updated copy (DiffusionNFT's default) | live weights (train/nft_old.py)
    nft_old_decay: tuple[int, float, float] = (0, 0.001, 0.5)  # nft soft: (flat, rate, cap), d_n = min(rate (n - flat), cap) (decay_type 1)
    nft_beta: float = Field(1.0, gt=0.0)  # nft: the implicit policies' mix beta (DiffusionNFT config.beta; cancels under current)
    timestep_strategy: Literal["fraction", "uniform", "window"] = "fraction"
    timestep_fraction: float = Field(0.5, gt=0.0, le=1.0)
    window_size: int = Field(2, ge=1)
    window_range: tuple[int, int] | None = None
    window_shift_interval: int = Field(25, ge=1)  # mixgrpo: steps between window moves (MixGRPO iters_per_group)
    window_stride: int = Field(1, ge=1)  # mixgrpo: denoising steps the window moves by (MixGRPO prog_overlap_step)
    chunk_generations: int = Field(8, ge=1)  # TSP chunk shape: generations x timesteps per forward/backward
    chunk_timesteps: int = Field(2, ge=1)
    ema_decay: float | None = Field(0.9, ge=0.0, le=1.0)  # EMA weights are used for eval and saved (Flow-GRPO's 0.9); null: none
    ema_every: int = Field(1, ge=1)  # EMA update every N optimizer steps (Flow-GRPO update_step_interval=8)
    ema_warmup: bool = True  # decay_n = min((1 + n) / (10 + n), ema_decay) as Flow-GRPO; False: fixed decay
    # Flow-GRPO's quirks (train/ema.py, train/step_work.py; README, "Recipes"); each off by default:
    micro_batch: int | None = Field(None, ge=1)  # samples of one Flow-GRPO micro-batch (its sample.train_batch_size x
    # GPUs): only the unit of ema_update=per_micro_batch and zero_adv_refill (the forwards are cut by chunk_*)
    ema_update: Literal["per_commit", "per_micro_batch"] = "per_commit"  # per_micro_batch: Flow-GRPO's ema.step per
    # micro-batch, k = P G / (M micro_batch) EMA updates per optimizer step with the same n and weights
    zero_adv_refill: bool = False  # Flow-GRPO: re-add random zero-advantage samples (seeded by run seed, step) until
    # the step's kept count is a multiple of P G / micro_batch; they train with A = 0 (KL only) and count (not pipelined)
    minibatch_split: Literal["groups", "samples", "generations"] = "groups"  # samples: Flow-GRPO's random permutation
    # of the kept samples per inner epoch, cut into M parts (every group in every minibatch: runtime.mode naive /
    # colocated only); generations: minibatch m takes generations [ceil(m G / M), ceil((m + 1) G / M)) of every
    # group (MixGRPO: 3 of each prompt's 12), group-local, so every mode runs it
    guard_bias: Literal["batch", "cell"] = "batch"  # grpo_guard: RatioNorm's bias averaged over the cells one forward
    # holds at one trained timestep (flow_grpo's per-device batch, algo.guard) | each cell's own (the paper's formula)
    cfg_in_training: bool = True  # apply CFG in the training forward when sampler.cfg_scale != 1
    cfg_detach_uncond: bool = False  # no gradient through the unconditional CFG branch in training
    # --- scale: memory plan, precision, recomputation, sharding ---
    chunk_cells: Literal["auto"] | None = None  # "auto": chunk shape from the memory plan (train.memory_gb)
    memory_gb: float | None = Field(None, gt=0.0)  # per-rank GPU memory the run is planned for; None: no check
    mixed_precision: Literal["none", "bf16", "fp16"] = "none"  # fp32 master weights + autocast compute
    loss_scale_init: float = Field(65536.0, gt=0.0)  # fp16: initial dynamic loss scale
    activation_checkpointing: bool = False  # recompute each transformer block's activations in backward
    sharding: Literal["none", "fsdp"] = "none"  # FSDP2 over the trainer ranks (fully_shard per block)
    cpu_offload: bool = False  # fsdp only: sharded weights, grads, AdamW state and EMA live in host memory
    shard_groups: int = Field(1, ge=1)  # fsdp only: hybrid sharding (HSDP): the trainer ranks form this many shard
    # groups of runtime.trainers / shard_groups ranks, data-parallel replicas of each other (the commit all-reduces
    # the gradient shards across them); each group is one trainer of the scheduler
    grad_sum: Literal["auto", "fp32", "fp64"] = "auto"  # the round's gradient summed over its chunks in float32
    # (arrival order) or float64 (order-free, cast at the commit: train.transaction); auto: fp64 where chunks go to
    # whichever trainer is free (a TSP mode with several trainers or shard groups), so two runs end bitwise equal

    @property
    def reward_mix(self) -> str:
        """``reward_aggregation`` in effect: the key, else the algorithm's reference (MixGRPO's advantage_aggr for
        mixgrpo: "advantages"; DanceGRPO's per-reward losses otherwise: "losses")."""
        if self.reward_aggregation is not None:
            return self.reward_aggregation
        return "advantages" if self.algorithm == "mixgrpo" else "losses"


class EvalConfig(_Strict):
    every: int = Field(20, ge=0)  # 0 = only before and after training
    num_prompts: int = Field(64, ge=1)
    grid_prompts: int = Field(8, ge=1)
    # reward-hacking guard (observe.hacking_guard): {name: {options}} scored on the eval samples, never optimised:
    # registered rewards (as in `reward`, no weight) and `drift` (image statistics against the base model's samples)
    guard: dict[str, dict[str, Any]] = {}
    guard_action: Literal["none", "warn", "checkpoint", "stop"] = "warn"  # when a guard falls while eval rises
    guard_tolerance: float = Field(0.1, gt=0.0)  # the fall that trips a guard: relative to its first value

    @field_validator("guard", mode="before")
    @classmethod
    def _guard_shorthand(cls, value: Any) -> Any:
        """``{drift: null}`` means ``{drift: {}}``."""
        return {k: ({} if v is None else v) for k, v in value.items()} if isinstance(value, dict) else value


class BTSOptions(_Strict):
    """Options of the BTS search (``schedule.bts.BTSConfig``), used when ``runtime.tag_policy`` is ``bts``."""

    depth: int = Field(2, ge=0)  # recursion depth over future bubbles
    budget_nodes: int = Field(2000, ge=1)  # search nodes per decision (deterministic; over it: shallower result)
    budget_s: float | None = Field(None, gt=0.0)  # optional wall-clock cap per decision (makes decisions load-dependent)
    max_branch: int = Field(4, ge=1)  # candidates k = 0..m when m <= max_branch, else {0, 1, 2, 4, ..., m}
    online: bool = True  # refine the profile from the run's own action times at every step (schedule.online_cost)
    online_decay: float = Field(0.5, ge=0.0, lt=1.0)  # weight of a step's action times one step later


class CalibrationOptions(_Strict):
    """When a run measures its cost profile on its own workers before the first step (``runtime.calibration``)."""

    when: Literal["auto", "always", "never"] = "auto"  # auto: where the scheduler needs costs (TAG modes without
    # runtime.profile); always: every run, written to run_dir/profile.json for `digenrl simulate/plan --profile`
    repeats: int = Field(2, ge=1)  # timed repeats of every op (after one warm-up); their mean is the cost


class RuntimeConfig(_Strict):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_enum_values=True)

    mode: Mode = Mode.COLOCATED  # validated against the scheduler's modes; stored as its string value
    generators: int = Field(1, ge=1)
    trainers: int = Field(1, ge=1)
    fragment_size: int = Field(4, ge=1)  # generations per fragment (GAP)
    max_stale_fraction: float = Field(0.25, ge=0.0, le=1.0)  # TCSS cap (0.5 made the demo end lower in 1 of 3 runs)
    address: str | None = None  # join an existing Ray cluster; None starts a local one
    generator_resources: dict[str, float] = {}
    trainer_resources: dict[str, float] = {}
    threads_per_worker: int = Field(1, ge=1, le=256)  # a local run: at most the machine's cores (validate.py)
    publish: Literal["object_store", "broadcast", "stream"] = "object_store"  # weight path trainers -> generators
    # (runtime/publish.py): rank 0's object-store copy, rank 0's broadcast, or every rank's shard streamed while
    # the trainers go on
    stale_hold: float = Field(0.0, ge=0.0, allow_inf_nan=False)  # full + broadcast: a generator waits instead of
    # starting a stale fragment that would end `overrun` s after the predicted commit when overrun x this > its
    # wait (schedule.stale_hold; 0: never waits; the planner picks it)
    gang_groups: bool = True  # sharded TAG: a gang takes one fragment per rank across prompt groups (false: only the
    # head group's, a smaller gang that ends sooner; the planner picks it)
    checkpoint_every: int = Field(20, ge=0)  # resumable checkpoint every N committed steps (0: only at the end / on a signal)
    keep_checkpoints: int = Field(2, ge=1)
    max_restarts: int = Field(3, ge=0)  # Ray modes: worker failures recovered (restart + replay) before giving up
    watchdog_s: float | None = Field(None, gt=0.0)  # a call silent this long is a failure; None: derived from the
    # cost model where the run has one (TAG modes, runtime.profile): 60 s + 20 x the action's modelled time; else
    # from the run's observed action times (runtime.deadlines.ObservedCosts: 60 s + 20 x the slowest seen so far)
    collective_timeout_s: float = Field(600.0, gt=0.0, allow_inf_nan=False)  # torch.distributed groups (trainer
    # pool, broadcast publish): a collective waiting longer fails with an error naming the rank and the action
    profile: str | None = None  # cost profile JSON for BTS (TAG modes); None: measured on the workers at start
    calibration: CalibrationOptions = CalibrationOptions()
    tag_inference_copy: bool = False  # TAG on a sharded pool: all-gather a plain (unsharded) copy of the weights
    # once per version, then each rank generates its share of a gang without per-forward gathers
    tag_policy: Literal["bts", "greedy", "none"] = "bts"  # TAG modes: who decides the fragments given to idle
    # trainer ranks at a bubble: the BTS search, greedy (one per idle rank while fragments are pending), none (k = 0)
    bts: BTSOptions = BTSOptions()
    inject_failure: str | None = None  # test hook "<worker>@<step>[:exit|:stall]": that worker fails at that step
    # (or at startup, calibrate, eval, checkpoint: control.run_plan.HOOK_PHASES)


    def bts_config(self):
        """The scheduler's ``BTSConfig`` for ``tag_policy`` and ``bts`` (pass it as ``Scheduler(bts_config=...)``)."""
        from digenrl.schedule.bts import BTSConfig

        b = self.bts
        return BTSConfig(depth=b.depth, budget_nodes=b.budget_nodes, budget_s=b.budget_s, max_branch=b.max_branch,
                         policy=self.tag_policy, online=b.online, online_decay=b.online_decay)


class LogConfig(_Strict):
    tensorboard: bool = False
    wandb: bool = False
    wandb_project: str = "digenrl"
    progress: bool = True
    print_every: int = Field(1, ge=0)  # one readable line per N steps on stdout (reward, parts, eval, kl, speed); 0: none


class Config(_Strict):
    run_dir: str = "runs/demo"
    resume: Literal["never", "auto"] = "never"  # auto: continue from run_dir's newest checkpoint if it has one
    seed: int = 0
    steps: int = Field(200, ge=0)
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    reward: dict[str, dict[str, Any]] = {"digits": {"weight": 1.0}}  # {name: {weight: w, ...}}; {name: w} for short
    sampler: SamplerConfig = SamplerConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    log: LogConfig = LogConfig()

    @field_validator("reward", mode="before")
    @classmethod
    def _reward_shorthand(cls, value: Any) -> Any:
        """``{pickscore: 0.5}`` (Flow-GRPO's ``reward_fn``) means ``{pickscore: {weight: 0.5}}``; ``{ocr: null}``
        means ``{ocr: {}}`` (weight 1)."""
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
        if t.algorithm == "grpo_guard" and (t.std_mode == "global" or t.adv_baseline == "batch") \
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
        if self.eval.guard and (self.runtime.mode != "colocated" or self.runtime.generators != 1
                                or self.runtime.trainers != 1):
            raise ValueError("eval.guard: runs in the single-process loop only (runtime.mode=colocated with "
                             "runtime.generators=1 and runtime.trainers=1): the Ray runtime's evals return only "
                             "the eval reward, not the samples a guard scores")
        self._check_quirks()
        if self.train.cpu_offload and self.train.sharding != "fsdp":
            raise ValueError("train.cpu_offload: needs train.sharding=fsdp (FSDP2 offloads the sharded state)")
        k = self.train.shard_groups
        if k > 1 and self.train.sharding != "fsdp":
            raise ValueError(f"train.shard_groups: {k} shard groups (hybrid sharding) need train.sharding=fsdp")
        if self.runtime.trainers % k:
            raise ValueError(f"train.shard_groups: {k} does not divide runtime.trainers {self.runtime.trainers} "
                             "(every shard group has the same number of ranks)")
        return self

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


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        nxt = node.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{dotted}: {k!r} is not a table")
        node = nxt
    node[keys[-1]] = value


def _format_validation(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        if e["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown key")
        else:
            got = e.get("input")
            lines.append(f"{key}: {e['msg']} (got {got!r})")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load YAML ``path`` (optional), apply ``key=value`` overrides (values parsed as YAML), validate."""
    tree: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        if p.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"config file {str(p)!r} is {p.stat().st_size} bytes (at most {MAX_CONFIG_BYTES})")
        try:
            loaded = safe_yaml_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {str(p)!r} is not valid YAML: {e}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(p)!r} must contain a mapping at top level")
        tree = loaded
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value (e.g. train.lr=1e-4)")
        key, raw = item.split("=", 1)
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r} has an empty key")
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(f"override {key!r}: its value is {len(raw)} characters (at most {MAX_CONFIG_BYTES})")
        try:
            value = safe_yaml_load(raw) if raw != "" else ""
        except yaml.composer.ComposerError as e:  # an alias: refused, not taken as a string
            raise ConfigError(f"override {key!r}: {e}") from None
        except yaml.YAMLError:
            value = raw
        _set_dotted(tree, key.strip(), value)
    try:
        return Config.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_format_validation(e)) from None


def dump_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.dump(cfg.model_dump(mode="json"), Dumper=_NoAliasDumper, sort_keys=False))
