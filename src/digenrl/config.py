"""Typed run configuration: YAML file + dotted ``key=value`` overrides, validated by pydantic.

Every table forbids unknown keys, so a typo is refused with the offending dotted key and the expected type
(``ConfigError``; the CLI turns it into exit code 2 before anything is written).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from digenrl.models.specs import SEQUENCE_PARALLEL_FAMILIES  # families with a sequence-parallel plan
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
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False,
                              use_attribute_docstrings=True)  # a field's docstring is its description (docs)


class LoraConfig(_Strict):
    enabled: bool = False
    """Train LoRA adapters (peft) instead of every weight of the transformer."""
    rank: int = Field(32, ge=1)
    """LoRA rank r."""
    alpha: float = Field(64.0, gt=0.0)
    """LoRA alpha (the adapters are scaled by alpha / r)."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """LoRA dropout."""
    target_modules: list[str] | None = None  # None: the family's default (Flow-GRPO recipes)
    """Module names the adapters wrap; null: the family's default (the Flow-GRPO recipes' targets)."""


class ModelConfig(_Strict):
    kind: str = "tiny_dit"
    """The policy family: `tiny_dit` (the CPU demo), `sd3`, `flux`, `wan`, `qwen_image` or `hunyuan_video`; checked
    against the diffusers directory's `model_index.json`.
    """
    path: str | None = None  # local diffusers directory / checkpoint; None = the built-in demo base weights
    """A local checkpoint (tiny_dit) or diffusers directory; never downloaded. null: the built-in demo base weights."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """The dtype the weights are loaded in (`float32`, `bfloat16`, `float16`); see `train.mixed_precision` for fp32
    master weights.
    """
    device: str = "cpu"
    """Torch device of every worker (`cpu`, `cuda`, `cuda:N`); refused when this machine has no such device."""
    lora: LoraConfig = LoraConfig()
    """LoRA settings (`model.lora.*`)."""
    prompt_cache_dir: str | None = None
    """On-disk prompt-embedding cache (`digenrl cache-prompts` fills it; one text encoder and encoding options per
    directory). When it covers every prompt the workers do not load the text encoders.
    """
    checkpoint: str | None = None  # trained weights (a run's checkpoint.safetensors) loaded over model.path's
    """A run's `checkpoint.safetensors` loaded over `model.path` (adapters under LoRA, else full weights)."""
    lora_path: str | None = None  # a LoRA adapter to train on: PEFT dir/file (flow_grpo's save_pretrained) or diffusers
    """A LoRA adapter to train on: a PEFT directory / `adapter_model.safetensors` (Flow-GRPO's `checkpoint-N/lora`) or
    a diffusers `pytorch_lora_weights.safetensors`; sets `model.lora` (rank, alpha, targets) from it.
    """
    options: dict[str, Any] = {}  # family-specific extras (e.g. height/width/frames)
    """Family options, typed per `model.kind` (`digenrl/model_options.py`): `height`, `width`, `frames` (video),
    `max_sequence_length`, `negative_prompt`, `load_text_encoders`, `vae_batch`, `vae_tiling`, `vae_slicing`,
    `prompt_cache_rows`, `reference_copy`; an unknown option is refused with the family's list.
    """

    @model_validator(mode="after")
    def _check_options(self) -> "ModelConfig":
        """``model.options`` against the family's typed options (``digenrl.model_options``)."""
        from digenrl.model_options import check_options

        check_options(self.kind, self.options)
        return self


class TaskConfig(_Strict):
    name: str = "digits"
    """`digits` (the CPU demo's task) or `text` (prompts from `task.prompts_file`)."""
    prompts_file: str | None = None  # one prompt per line (real models), or a dataset dir (train.txt / test.txt)
    """Train prompts: one per line, JSONL with a `prompt` field (other keys kept as metadata), or a Flow-GRPO dataset
    directory (`train.txt` / `test.txt`, or `train_metadata.jsonl` / `test_metadata.jsonl`).
    """
    eval_prompts_file: str | None = None
    """Held-out eval prompts (same formats); unset: the dataset directory's test split, else the first train prompts
    (the run warns).
    """


class SamplerConfig(_Strict):
    num_steps: int = Field(10, ge=1)
    """T: denoising steps of a training trajectory."""
    eval_num_steps: int | None = Field(None, ge=1)  # default: num_steps
    """Denoising steps of the eval's ODE sampling; null: `sampler.num_steps`."""
    noise_level: float = Field(0.7, ge=0.0)
    """The SDE's noise: a (`flow_grpo`, `cps`) or eta (`dance`)."""
    kind: Literal["flow_grpo", "dance", "cps"] = "flow_grpo"
    """The SDE step: `flow_grpo` (Flow-GRPO), `dance` (DanceGRPO, constant eta) or `cps` (coefficients-preserving
    sampling).
    """
    cfg_scale: float = Field(1.0, ge=0.0)
    """Classifier-free guidance scale (also in the training forward unless `train.cfg_in_training=false`; a
    guidance-embedding model such as FLUX.1-dev always gets it).
    """
    eval_cfg_scale: float | None = Field(None, ge=0.0)  # Flow-GRPO's sample.eval_guidance_scale; None = cfg_scale
    """Guidance scale of the eval (Flow-GRPO's `sample.eval_guidance_scale`); null: `sampler.cfg_scale`."""
    static_shift: float | None = Field(None, gt=0.0)  # DanceGRPO --shift: its schedule instead of the family's
    """DanceGRPO's static sigma shift (`--shift`), replacing the family's schedule; null: the family's."""
    integer_timesteps: bool | Literal["sampling"] = False  # the model gets int(sigma * 1000) / 1000 (DanceGRPO's and
    # MixGRPO's timesteps, sampling and training); "sampling": only while sampling, float time in training (DiffusionNFT)
    """Give the model int(sigma x 1000) / 1000 as DanceGRPO and MixGRPO do, in sampling and training; `sampling`: only
    while sampling, float time in training (DiffusionNFT; `train.algorithm=nft` only).
    """
    same_latent: bool = False  # one initial noise per prompt group (Flow-GRPO same_latent, DanceGRPO init_same_noise)
    """One initial noise per prompt group (Flow-GRPO `same_latent`, DanceGRPO `init_same_noise`)."""
    post_solver: Literal["euler", "dpmpp_2m"] = "euler"  # mixgrpo: ODE solver after the window (dpmpp_2m: MixGRPO-Flash)
    """`train.algorithm=mixgrpo` only: the ODE after the SDE window, `euler` or `dpmpp_2m` (DPM-Solver++ 2M,
    MixGRPO-Flash).
    """
    post_compress_ratio: float = Field(1.0, gt=0.0, le=1.0)  # mixgrpo: steps kept after the window (Flash: 0.4)
    """`train.algorithm=mixgrpo` only: the share of the steps after the window kept (MixGRPO-Flash's 0.4; below 1 needs
    `sampler.static_shift`).
    """
    nft_solver: Literal["dpmpp_2m", "euler"] = "dpmpp_2m"  # nft: its ODE (DiffusionNFT sample.solver="dpm2"; eval: Euler)
    """`train.algorithm=nft` only: the sampling ODE, `dpmpp_2m` (DiffusionNFT's `dpm2`) or `euler`; the eval samples
    with Euler.
    """


_Beta = Annotated[float, Field(ge=0.0, lt=1.0)]  # an AdamW beta




class SequenceParallelConfig(_Strict):
    """Sequence (context) parallelism of one model replica: every sample's latent tokens are split over
    ``ulysses x ring`` ranks that run each forward together (docs/sequence_parallel.md). An int ``n`` means
    ``{ulysses: n}``. Ulysses: all-to-all before and after each attention (tokens split -> heads split -> tokens
    split); ring (KV passed around the ranks) needs an attention kernel that returns the log-sum-exp, which
    diffusers' CPU/native backend does not: refused for now."""

    ulysses: int = Field(1, ge=1)
    """Ulysses degree: ranks that split the sequence and exchange it for heads around each attention."""
    ring: int = Field(1, ge=1)
    """Ring degree (refused above 1: diffusers' native attention backend returns no log-sum-exp)."""

    @model_validator(mode="before")
    @classmethod
    def _degree_shorthand(cls, value: Any) -> Any:
        return {"ulysses": value} if isinstance(value, int) and not isinstance(value, bool) else value

    @property
    def degree(self) -> int:
        """Ranks per sequence-parallel group."""
        return self.ulysses * self.ring


class TrainConfig(_Strict):
    prompts_per_step: int = Field(8, ge=1)  # P
    """P: prompts (groups) per step."""
    generations: int = Field(8, ge=2)  # G
    """G: generations per prompt (the group the advantage is normalised in)."""
    lr: float = Field(1e-4, gt=0.0)  # demo: 3e-4 peaked then oscillated (eval 0.97 -> 0.84); 1e-4 + EMA ends at its peak
    """AdamW learning rate."""
    weight_decay: float = Field(0.0, ge=0.0)
    """AdamW weight decay."""
    betas: tuple[_Beta, _Beta] = (0.9, 0.999)
    """AdamW betas, each in [0, 1)."""
    max_grad_norm: float | None = Field(1.0, gt=0.0)  # None: no clipping (the norm is still checked finite)
    """Gradient clipping norm; null: no clipping (the norm is still checked finite)."""
    adam_epsilon: float = Field(1e-8, gt=0.0)  # Flow-GRPO train.adam_epsilon
    """AdamW epsilon."""
    clip_range: float = Field(0.2, gt=0.0)
    """PPO clip of the ratio: 1 +- clip_range."""
    clip_range_low: float | None = Field(None, gt=0.0)  # asymmetric clip r >= 1 - low (Flow-GRPO clip_range_lt)
    """Asymmetric clip: r >= 1 - low (Flow-GRPO `clip_range_lt`); null: `train.clip_range`."""
    clip_range_high: float | None = Field(None, gt=0.0)  # r <= 1 + high (clip_range_gt); None = clip_range
    """Asymmetric clip: r <= 1 + high (Flow-GRPO `clip_range_gt`); null: `train.clip_range`."""
    adv_clip_max: float = Field(5.0, gt=0.0)
    """Advantages are clipped to +- this."""
    std_mode: Literal["group", "global"] = "group"
    """The advantage's std: per `group` or `global` over the step (pipelined modes rescale at the commit, which then
    waits for the step's last reward).
    """
    adv_baseline: Literal["group", "batch"] = "group"  # batch = Flow-GRPO per_prompt_stat_tracking=False
    """The advantage's mean: per `group`, or over the whole `batch` (Flow-GRPO `per_prompt_stat_tracking=False`)."""
    adv_std_unbiased: bool = False  # True: DanceGRPO's torch std (n - 1)
    """Unbiased (n - 1) std as DanceGRPO's torch.std; false: the population std."""
    adv_eps: float = Field(1e-4, gt=0.0)  # Flow-GRPO 1e-4, DanceGRPO 1e-8
    """Epsilon added to the std (Flow-GRPO 1e-4, DanceGRPO 1e-8)."""
    adv_per_reward: bool = False  # normalise each reward part in its group (DanceGRPO vq/mq, MixGRPO advantage_aggr)
    """Normalise each reward part in its group (DanceGRPO's multi-reward advantages, MixGRPO's `advantage_aggr`);
    `train.reward_aggregation` says how the per-reward advantages enter the loss.
    """
    reward_aggregation: Literal["advantages", "losses"] | None = None  # adv_per_reward: how the A_k enter the loss:
    # advantages = one clipped loss of clamp(sum_k w_k A_k, +-adv_clip_max) (MixGRPO), losses = sum_k w_k L(A_k)
    # (DanceGRPO); None: the algorithm's reference (mixgrpo: advantages, else losses)
    """`adv_per_reward` only: how the per-reward advantages A_k enter the loss: `advantages`, one clipped loss of
    clamp(sum_k w_k A_k, +-`adv_clip_max`) (MixGRPO); `losses`, sum_k w_k L(A_k) (DanceGRPO); null: the algorithm's
    reference (`mixgrpo`: advantages, else losses).
    """
    best_of_n: int | None = Field(None, ge=2)  # DanceGRPO --bestofn: train the n/2 best and n/2 worst of each group
    """DanceGRPO's `--bestofn`: train only the n/2 best and n/2 worst generations of each group (every mode)."""
    filter_zero_advantage: bool = True  # Flow-GRPO drops samples with advantage 0 (no loss, no KL, not counted)
    """Drop samples whose advantage is 0 (no loss, no KL, not counted), as Flow-GRPO."""
    beta_kl: float = Field(0.0, ge=0.0)
    """Weight of the KL to the reference policy."""
    kl_form: Literal["flow_grpo", "exact"] = "flow_grpo"  # exact = Flow-GRPO's KL / (-dt)
    """`flow_grpo`: Flow-GRPO's KL units; `exact`: the transition's Gaussian KL (Flow-GRPO's / -dt)."""
    minibatches_per_step: int = Field(1, ge=1)  # M optimizer steps per step, groups split by index (docs/architecture.md, "Minibatches")
    """M optimizer steps per step: the step's groups split by index into M minibatches (one publish per step)."""
    inner_epochs: int = Field(1, ge=1)  # passes over the step's minibatches (Flow-GRPO num_inner_epochs)
    """Passes over the step's minibatches (Flow-GRPO `num_inner_epochs`); optimizer steps per step = M x epochs."""
    algorithm: Literal["flow_grpo", "grpo_guard", "mixgrpo", "nft"] = "flow_grpo"  # loss + sampler contract (docs/math.md, "Algorithms")
    """The loss and sampler contract: `flow_grpo`, `grpo_guard` (RatioNorm + per-timestep reweight), `mixgrpo` (SDE
    only in a moving window) or `nft` (DiffusionNFT); part of the checkpoint's math (a change is refused on resume).
    See the algorithms page.
    """
    nft_timesteps: int | None = Field(None, ge=1)  # nft: training timesteps K per sample; None: int(0.99 T) (DiffusionNFT)
    """`nft` only: K training timesteps per sample; null: int(0.99 T)."""
    nft_old_policy: Literal["soft", "current"] = "soft"  # nft: old = soft-updated copy (DiffusionNFT's default) | live weights (train/nft_old.py)
    """`nft` only: the old policy the generators sample with, `soft` (a copy updated old <- d old + (1 - d) theta after
    each step) or `current` (the step's starting weights).
    """
    nft_old_decay: tuple[int, float, float] = (0, 0.001, 0.5)  # nft soft: (flat, rate, cap), d_n = min(rate (n - flat), cap) (decay_type 1)
    """`nft` soft old policy: (flat, rate, cap), d_n = min(rate (n - flat), cap) (DiffusionNFT `decay_type` 1: (0,
    0.001, 0.5)).
    """
    nft_beta: float = Field(1.0, gt=0.0)  # nft: the implicit policies' mix beta (DiffusionNFT config.beta; cancels under current)
    """`nft` only: the implicit policies' mix v+- = (1 -+ beta) v_old +- beta v (cancels under `current`)."""
    timestep_strategy: Literal["fraction", "uniform", "window"] = "fraction"
    """Which timesteps train: `fraction` (the first int(T x fraction) steps), `uniform` or `window` (an SDE window, ODE
    outside).
    """
    timestep_fraction: float = Field(0.5, gt=0.0, le=1.0)
    """`fraction`: the first int(T x fraction) denoising steps are trained (Flow-GRPO's truncation)."""
    window_size: int = Field(2, ge=1)
    """`window` / `mixgrpo`: steps in the SDE window."""
    window_range: tuple[int, int] | None = None
    """`window`: the window lies inside [start, end) (Flow-GRPO `sde_window_range`); null: anywhere."""
    window_shift_interval: int = Field(25, ge=1)  # mixgrpo: steps between window moves (MixGRPO iters_per_group)
    """`mixgrpo`: steps between window moves (MixGRPO `iters_per_group`)."""
    window_stride: int = Field(1, ge=1)  # mixgrpo: denoising steps the window moves by (MixGRPO prog_overlap_step)
    """`mixgrpo`: denoising steps the window moves by (MixGRPO `prog_overlap_step`)."""
    chunk_generations: int = Field(8, ge=1)  # TSP chunk shape: generations x timesteps per forward/backward
    """TSP chunk shape: generations per forward/backward."""
    chunk_timesteps: int = Field(2, ge=1)
    """TSP chunk shape: timesteps per forward/backward."""
    ema_decay: float | None = Field(0.9, ge=0.0, le=1.0)  # EMA weights are used for eval and saved (Flow-GRPO's 0.9); null: none
    """EMA of the trainable weights, used for eval and the final checkpoint (Flow-GRPO's 0.9); null: no EMA."""
    ema_every: int = Field(1, ge=1)  # EMA update every N optimizer steps (Flow-GRPO update_step_interval=8)
    """EMA update every N optimizer steps (Flow-GRPO `update_step_interval`)."""
    ema_warmup: bool = True  # decay_n = min((1 + n) / (10 + n), ema_decay) as Flow-GRPO; False: fixed decay
    # Flow-GRPO's quirks (train/ema.py, train/step_math.py; docs/math.md, "Recipes"); each off by default:
    """decay_n = min((1 + n) / (10 + n), ema_decay) as Flow-GRPO; false: the fixed decay."""
    micro_batch: int | None = Field(None, ge=1)  # samples of one Flow-GRPO micro-batch (its sample.train_batch_size x
    # GPUs): only the unit of ema_update=per_micro_batch and zero_adv_refill (the forwards are cut by chunk_*)
    """Samples of one Flow-GRPO micro-batch (`sample.train_batch_size` x GPUs): only the unit of
    `ema_update=per_micro_batch` and `zero_adv_refill`.
    """
    ema_update: Literal["per_commit", "per_micro_batch"] = "per_commit"  # per_micro_batch: Flow-GRPO's ema.step per
    # micro-batch, k = P G / (M micro_batch) EMA updates per optimizer step with the same n and weights
    """`per_micro_batch`: Flow-GRPO's EMA step per micro-batch, k = P G / (M micro_batch) updates per optimizer step;
    `per_commit`: one per optimizer step.
    """
    zero_adv_refill: bool = False  # Flow-GRPO: re-add random zero-advantage samples (seeded by run seed, step) until
    # the step's kept count is a multiple of P G / micro_batch; they train with A = 0 (KL only) and count (not pipelined)
    """Flow-GRPO's re-added zero-advantage samples (seeded by seed and step) until the kept count fills whole
    micro-batches; colocated / naive only.
    """
    minibatch_split: Literal["groups", "samples", "generations"] = "groups"  # samples: Flow-GRPO's random permutation
    # of the kept samples per inner epoch, cut into M parts (every group in every minibatch: runtime.mode naive /
    # colocated only); generations: minibatch m takes generations j with floor(j M / G) = m of every
    # group (MixGRPO: 3 of each prompt's 12), group-local, so every mode runs it
    """`groups`: whole groups by index; `samples`: Flow-GRPO's minibatches from a seeded permutation of the samples
    (colocated / naive only); `generations`: minibatch m takes the generations j with floor(j M / G) = m of every group
    (MixGRPO: 3 of each prompt's 12; every mode).
    """
    guard_bias: Literal["batch", "cell"] = "batch"  # grpo_guard: RatioNorm's bias averaged over the cells one forward
    # holds at one trained timestep (flow_grpo's per-device batch, algo.guard) | each cell's own (the paper's formula)
    """`grpo_guard` only: RatioNorm's bias averaged over the cells one forward holds at one trained timestep (`batch`,
    flow_grpo's per-device batch) or each cell's own (`cell`, the paper's per-sample formula).
    """
    cfg_in_training: bool = True  # apply CFG in the training forward when sampler.cfg_scale != 1
    """Apply CFG in the training forward when `sampler.cfg_scale` != 1."""
    cfg_detach_uncond: bool = False  # no gradient through the unconditional CFG branch in training
    """No gradient through the unconditional CFG branch in training."""
    # --- scale: memory plan, precision, recomputation, sharding ---
    chunk_cells: Literal["auto"] | None = None  # "auto": chunk shape from the memory plan (train.memory_gb)
    """`auto`: the chunk shape is the largest that fits `train.memory_gb` (the memory plan); null: `chunk_generations`
    x `chunk_timesteps`.
    """
    memory_gb: float | None = Field(None, gt=0.0)  # per-rank GPU memory the run is planned for; None: no check
    """Per-rank GPU memory the run is planned for: a config whose memory plan does not fit is refused with the per-item
    numbers; null: no check.
    """
    mixed_precision: Literal["none", "bf16", "fp16"] = "none"  # fp32 master weights + autocast compute
    """`bf16` / `fp16` autocast with fp32 master weights (fp16 with dynamic loss scaling); `none`: the load dtype."""
    loss_scale_init: float = Field(65536.0, gt=0.0)  # fp16: initial dynamic loss scale
    """fp16: the initial dynamic loss scale."""
    activation_checkpointing: bool = False  # recompute each transformer block's activations in backward
    """Recompute each transformer block's activations in backward."""
    sharding: Literal["none", "fsdp"] = "none"  # FSDP2 over the trainer ranks (fully_shard per block)
    """`fsdp`: FSDP2 over the trainer ranks (one shard group whose chunks, TAG fragments and commits are collectives);
    `none`: replicated ranks.
    """
    cpu_offload: bool = False  # fsdp only: sharded weights, grads, AdamW state and EMA live in host memory
    """`fsdp` only: sharded weights, gradients, AdamW state and EMA in host memory, the optimizer stepping on the CPU."""
    shard_groups: int = Field(1, ge=1)  # fsdp only: hybrid sharding (HSDP): the trainer ranks form this many shard
    # groups of runtime.trainers / shard_groups ranks, data-parallel replicas of each other (the commit all-reduces
    # the gradient shards across them); each group is one trainer of the scheduler
    """`fsdp` only: hybrid sharding, k shard groups of `runtime.trainers` / k ranks (k divides it), data-parallel
    replicas of each other.
    """
    old_logprob: Literal["generator", "recompute"] = "generator"
    """logp_old of the clipped ratio: `generator`, the behaviour log-probs the generators recorded (Flow-GRPO), or
    `recompute`, the trainers' own under the step's starting weights (verl's recomputed old log-prob; the first
    round's forward gives it for free, later rounds run one no-grad forward of a step-start snapshot)
    ([fast generator](fast_generator.md)).
    """
    tis_cap: float | None = Field(None, ge=1.0)
    """`recompute` only: truncated importance sampling of the generator's distribution, each cell's policy term x
    min(exp(logp_old - logp_gen), cap), detached (verl's TIS); null: off.
    """
    sequence_parallel: SequenceParallelConfig = SequenceParallelConfig()
    """Sequence (context) parallelism of the trainers (an int d means `{ulysses: d}`): d consecutive trainer ranks
    split each cell's latent tokens (Ulysses all-to-all; `wan`, `hunyuan_video`; ring refused) and form one lane,
    one trainer of the scheduler (a data-parallel lane of a shard group under `fsdp`)
    ([sequence parallelism](sequence_parallel.md)).
    """
    grad_sum: Literal["auto", "fp32", "fp64"] = "auto"  # the round's gradient summed over its chunks in float32
    # (arrival order) or float64 (order-free, cast at the commit: train.transaction); auto: fp64 where chunks go to
    # whichever trainer is free (a TSP mode with several trainers or shard groups), so two runs end bitwise equal
    """How a round's chunk gradients are summed: `fp32` (in arrival order) or `fp64` (order-free, cast back at the
    commit, so two runs end bitwise equal whichever trainer trained which chunk); `auto`: fp64 where chunks go to
    whichever trainer is free (a TSP mode with several trainers or shard groups).
    """

    @property
    def reward_mix(self) -> str:
        """``reward_aggregation`` in effect: the key, else the algorithm's reference (MixGRPO's advantage_aggr for
        mixgrpo: "advantages"; DanceGRPO's per-reward losses otherwise: "losses")."""
        if self.reward_aggregation is not None:
            return self.reward_aggregation
        return "advantages" if self.algorithm == "mixgrpo" else "losses"


class EvalConfig(_Strict):
    every: int = Field(20, ge=0)  # 0 = only before and after training
    """Eval every N steps (ODE sampling of the eval prompts with the EMA weights); 0: only before and after training."""
    num_prompts: int = Field(64, ge=1)
    """Eval prompts (at most those the eval set has; the run warns when it has fewer)."""
    grid_prompts: int = Field(8, ge=1)
    # reward-hacking guard (observe.hacking_guard): {name: {options}} scored on the eval samples, never optimised:
    # registered rewards (as in `reward`, no weight) and `drift` (image statistics against the base model's samples)
    """Samples in each eval's grid (`samples_before.png`, `samples/eval_step_N.png`, `samples_after.png`)."""
    guard: dict[str, dict[str, Any]] = {}
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


class BTSOptions(_Strict):
    """Options of the BTS search (``schedule.bts.BTSConfig``), used when ``runtime.tag_policy`` is ``bts``."""

    depth: int = Field(2, ge=0)  # recursion depth over future bubbles
    """Recursion depth over future bubbles (2: depth 0 was slower under jitter with TCSS, depth 4 never faster;
    `benchmarks/bts_depth.py`, [simulation](simulation.md) "Where depth matters")."""
    budget_nodes: int = Field(2000, ge=1)  # search nodes per decision (deterministic; over it: shallower result)
    """Search nodes per decision (deterministic; over it: a shallower result)."""
    budget_s: float | None = Field(None, gt=0.0)  # optional wall-clock cap per decision (makes decisions load-dependent)
    """Optional wall-clock cap per decision (makes decisions load-dependent)."""
    max_branch: int = Field(4, ge=1)  # candidates k = 0..m when m <= max_branch, else {0, 1, 2, 4, ..., m}
    """Candidates k = 0..m when m <= max_branch, else {0, 1, 2, 4, ..., m}."""
    online: bool = True  # refine the profile from the run's own action times at every step (schedule.online_cost)
    """BTS's profile follows the run's own action times, one factor per action kind refined every step
    (`cost_scale/<kind>` in metrics.jsonl).
    """
    online_decay: float = Field(0.5, ge=0.0, lt=1.0)  # weight of a step's action times one step later
    """The weight of a step's action times one step later."""


class CalibrationOptions(_Strict):
    """When a run measures its cost profile on its own workers before the first step (``runtime.calibration``)."""

    when: Literal["auto", "always", "never"] = "auto"  # auto: where the scheduler needs costs (TAG modes without
    # runtime.profile); always: every run, written to run_dir/profile.json for `digenrl simulate/plan --profile`
    """When a run times its ops on its own workers before step 1: `auto` (TAG modes without `runtime.profile`),
    `always` or `never`; written to `run_dir/profile.json`.
    """
    repeats: int = Field(2, ge=1)  # timed repeats of every op (after one warm-up); their mean is the cost
    """Timed repeats of every op (after one warm-up); their mean is the cost."""


class RuntimeConfig(_Strict):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_enum_values=True,
                              use_attribute_docstrings=True)

    mode: Mode = Field(Mode.COLOCATED, validate_default=True)  # validated against the scheduler's modes; stored as its string value
    """`colocated`, `naive`, `gap`, `gap_tsp`, `gap_tsp_tag` or `full` (TCSS); anything but a single-worker `colocated`
    runs on Ray.
    """
    generators: int = Field(1, ge=1)
    """Generator pool size (colocated: unused, keep 1)."""
    trainers: int = Field(1, ge=1)
    """Trainer ranks (colocated: workers that both generate and train)."""
    fragment_size: int = Field(4, ge=1)  # generations per fragment (GAP)
    """GAP fragment: generations of one prompt group per generate action (clipped to G)."""
    max_stale_fraction: float = Field(0.25, ge=0.0, le=1.0)  # TCSS cap (0.5 made the demo end lower in 1 of 3 runs)
    """`full` (TCSS): at most this share of a step generated one version stale."""
    address: str | None = None  # join an existing Ray cluster; None starts a local one
    """Join this Ray cluster (`HEAD:6379` or `auto`); null: start a local Ray."""
    generator_resources: dict[str, float] = {}
    """Ray resources each generator asks for (custom labels place heterogeneous pools; `CPU` / `GPU` override the
    counts).
    """
    trainer_resources: dict[str, float] = {}
    """Ray resources each trainer rank asks for."""
    threads_per_worker: int = Field(1, ge=1, le=256)  # a local run: at most the machine's cores (validate.py)
    """Torch threads (and Ray CPUs) per worker; a local run: at most the machine's cores."""
    publish: Literal["object_store", "broadcast", "stream"] = "object_store"  # weight path trainers -> generators
    # (runtime/publish.py): rank 0's object-store copy, rank 0's broadcast, or every rank's shard streamed while
    # the trainers go on
    """Weight path trainers -> generators: `object_store` (rank 0's copy), `broadcast` (torch.distributed) or `stream`
    (every rank's shards, sent while the trainers go on).
    """
    stale_hold: float = Field(0.0, ge=0.0, allow_inf_nan=False)  # full + broadcast: a generator waits instead of
    # starting a stale fragment that would end `overrun` s after the predicted commit when overrun x this > its
    # wait (schedule.stale_hold; 0: never waits; the planner picks it)
    """`full` with `broadcast` / `stream`: a free generator waits instead of starting a stale fragment that would end
    `overrun` s past the step's predicted commit when overrun x this > its wait; 0: never waits (the planner picks
    it).
    """
    gang_groups: bool = True  # sharded TAG: a gang takes one fragment per rank across prompt groups (false: only the
    # head group's, a smaller gang that ends sooner; the planner picks it)
    """TAG on a sharded pool: a gang takes the next fragment per rank across prompt groups; false: only the head
    group's.
    """
    checkpoint_every: int = Field(20, ge=0)  # resumable checkpoint every N committed steps (0: only at the end / on a signal)
    """A resumable checkpoint every N committed steps in `run_dir/checkpoints/` (0: only at the end and on a signal)."""
    keep_checkpoints: int = Field(2, ge=1)
    """The newest K resumable checkpoints are kept."""
    max_restarts: int = Field(3, ge=0)  # Ray modes: worker failures recovered (restart + replay) before giving up
    """Ray modes: worker failures recovered (restart + replay) per run before the run stops."""
    watchdog_s: float | None = Field(None, gt=0.0)  # a call silent this long is a failure; None: derived from the
    # cost model where the run has one (TAG modes, runtime.profile): 60 s + 20 x the action's modelled time; else
    # from the run's observed action times (runtime.deadlines.ObservedCosts: 60 s + 20 x the slowest seen so far)
    """Seconds before a silent worker call counts as stalled; null: derived (60 s + 20 x the action's modelled or
    observed time).
    """
    collective_timeout_s: float = Field(600.0, gt=0.0, allow_inf_nan=False)  # torch.distributed groups (trainer
    # pool, broadcast publish): a collective waiting longer fails with an error naming the rank and the action
    """Seconds a torch.distributed collective may wait for the other ranks; longer is an error naming the rank and its
    action.
    """
    profile: str | None = None  # cost profile JSON for BTS (TAG modes); None: measured on the workers at start
    """A cost profile JSON (`digenrl profile`, a run's `profile.json` / `profile_observed.json`) for BTS and the
    watchdog; null: measured on the workers at start where needed.
    """
    calibration: CalibrationOptions = CalibrationOptions()
    """When and how the run measures its own costs (`runtime.calibration.*`)."""
    tag_inference_copy: bool = False  # TAG on a sharded pool: all-gather a plain (unsharded) copy of the weights
    # once per version, then each rank generates its share of a gang without per-forward gathers
    """TAG on a sharded pool: all-gather an unsharded copy of the weights once per version and generate from it without
    per-forward gathers.
    """
    tag_policy: Literal["bts", "greedy", "none"] = "bts"  # TAG modes: who decides the fragments given to idle
    # trainer ranks at a bubble: the BTS search, greedy (one per idle rank while fragments are pending), none (k = 0)
    """TAG modes: `bts` (the search), `greedy` (one fragment per idle trainer rank) or `none`."""
    bts: BTSOptions = BTSOptions()
    """Options of the BTS search (`runtime.bts.*`)."""
    generator_sequence_parallel: SequenceParallelConfig = SequenceParallelConfig()
    """The same for generators: each generator is d Ray actors in one torch.distributed group that denoise each
    fragment together; disaggregated modes only ([sequence parallelism](sequence_parallel.md)).
    """


    def bts_config(self):
        """The scheduler's ``BTSConfig`` for ``tag_policy`` and ``bts`` (pass it as ``Scheduler(bts_config=...)``)."""
        from digenrl.schedule.bts import BTSConfig

        b = self.bts
        return BTSConfig(depth=b.depth, budget_nodes=b.budget_nodes, budget_s=b.budget_s, max_branch=b.max_branch,
                         policy=self.tag_policy, online=b.online, online_decay=b.online_decay)


class GeneratorConfig(_Strict):
    """The generator pool's inference copy of the policy (``models.fast_generator``; docs/fast_generator.md). The
    trainers keep their own weights, and TAG fragments are generated with them."""

    merge_lora: bool = False
    """Merge the LoRA delta into the base weights once per published version, W = W0 + s B A (no adapter matmuls
    per forward); needs `model.lora.enabled` and a generator pool.
    """
    dtype: Literal["bfloat16", "float16", "float32"] | None = None
    """The copy's weight dtype (bf16 on GPU), independent of the trainers' masters; the SDE step and the recorded
    log-probs stay float32; null: `model.dtype`.
    """
    compile: Literal["none", "default", "reduce-overhead", "max-autotune"] = "none"
    """`torch.compile` of the transformer forward at the run's fixed shapes, compiled once and reused across versions
    (weights swapped in place); `reduce-overhead` adds CUDA graphs.
    """


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
        degree that divides the ranks it groups (the heads and the tokens are checked when the model is built)."""
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
        if t.adv_per_reward and (t.std_mode == "global" or t.adv_baseline == "batch") and mode.pipelined:
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


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        nxt = node.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{dotted}: {k!r} is not a table")
        node = nxt
    node[keys[-1]] = value


def _fields_at(loc: tuple) -> list[str]:
    """The keys of the config table at ``loc`` (a pydantic error location), or [] where it is not a table."""
    model: Any = Config
    """The policy (`model.*`)."""
    for part in loc:
        field = model.model_fields.get(str(part)) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return []
        model = field.annotation
    return list(model.model_fields)


def _error_line(e: dict) -> str:
    """One pydantic error as ``key: what is wrong; what to do``."""
    loc = tuple(e["loc"])
    key = ".".join(str(p) for p in loc) or "<root>"
    if e["type"] == "extra_forbidden":
        from digenrl.model_options import did_you_mean

        fields = _fields_at(loc[:-1])
        parent = ".".join(str(p) for p in loc[:-1])
        hint = did_you_mean(str(loc[-1]), fields, parent + "." if parent else "")
        return f"{key}: unknown key{hint}" + ("" if hint or not fields else f" ({parent or 'top level'} keys: "
                                                                          f"{', '.join(fields)})")
    if e["type"] == "value_error":  # a validator's own message: it names its key and what to do
        msg = str(e.get("ctx", {}).get("error", e["msg"]))
        head = msg.split(":", 1)[0]
        if "." in head and " " not in head or not loc:
            return msg
        return f"{key}: {msg}"
    got = repr(e.get("input"))
    return f"{key}: {e['msg']} (got {got if len(got) <= 80 else got[:77] + '...'})"


def _format_validation(err: ValidationError) -> str:
    """One line for one error (``train.lrr: unknown key; did you mean train.lr?``), else a list."""
    lines = [_error_line(e) for e in err.errors()]
    if len(lines) == 1:
        return lines[0]
    return "invalid configuration:\n  " + "\n  ".join(lines)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load YAML ``path`` (optional), apply ``key=value`` overrides (values parsed as YAML), validate."""
    tree: dict[str, Any] = {}
    if path is not None:
        from digenrl.presets import resolve_config_arg

        try:
            p = Path(resolve_config_arg(path))  # --config preset:flux1_dev: the shipped preset of that name
        except ValueError as e:
            raise ConfigError(str(e)) from None
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
