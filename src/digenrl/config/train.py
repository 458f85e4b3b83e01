"""The training section (``train.*``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .base import _Strict
from .model import SequenceParallelConfig


_Beta = Annotated[float, Field(ge=0.0, lt=1.0)]  # an AdamW beta


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
    reward_aggregation: Literal["advantages", "losses"] | None = None  # None: TrainConfig.reward_mix
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
    ema_warmup: bool = True
    """decay_n = min((1 + n) / (10 + n), ema_decay) as Flow-GRPO; false: the fixed decay."""
    # Flow-GRPO's quirks (train/ema.py, train/step_math.py; docs/math.md, "Recipes"); each off by default:
    micro_batch: int | None = Field(None, ge=1)  # the forwards are cut by chunk_*, not by this
    """Samples of one Flow-GRPO micro-batch (`sample.train_batch_size` x GPUs): only the unit of
    `ema_update=per_micro_batch` and `zero_adv_refill`.
    """
    ema_update: Literal["per_commit", "per_micro_batch"] = "per_commit"  # the k updates: same n, same weights
    """`per_micro_batch`: Flow-GRPO's EMA step per micro-batch, k = P G / (M micro_batch) updates per optimizer step;
    `per_commit`: one per optimizer step.
    """
    zero_adv_refill: bool = False  # the re-added samples train with A = 0 (KL only) and count
    """Flow-GRPO's re-added zero-advantage samples (seeded by seed and step) until the kept count fills whole
    micro-batches; colocated / naive only.
    """
    minibatch_split: Literal["groups", "samples", "generations"] = "groups"  # samples: a permutation per inner epoch
    """`groups`: whole groups by index; `samples`: Flow-GRPO's minibatches from a seeded permutation of the samples
    (colocated / naive only); `generations`: minibatch m takes the generations j with floor(j M / G) = m of every group
    (MixGRPO: 3 of each prompt's 12; every mode).
    """
    guard_bias: Literal["batch", "cell"] = "batch"  # algo.guard
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
    activation_checkpointing: bool = False  # recompute each transformer block's activations in backward
    """Recompute each transformer block's activations in backward."""
    sharding: Literal["none", "fsdp"] = "none"  # FSDP2 over the trainer ranks (fully_shard per block)
    """`fsdp`: FSDP2 over the trainer ranks (one shard group whose chunks, TAG fragments and commits are collectives);
    `none`: replicated ranks.
    """
    cpu_offload: bool = False  # fsdp only: sharded weights, grads, AdamW state and EMA live in host memory
    """`fsdp` only: sharded weights, gradients, AdamW state and EMA in host memory, the optimizer stepping on the CPU."""
    shard_groups: int = Field(1, ge=1)  # HSDP: the commit all-reduces the gradient shards across the groups; each
    # group is one trainer of the scheduler
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
    grad_sum: Literal["auto", "fp32", "fp64"] = "auto"  # fp64: cast back at the commit (train.transaction)
    """How a round's chunk gradients are summed: `fp32` (in arrival order) or `fp64` (order-free, cast back at the
    commit, so two runs end bitwise equal whichever trainer trained which chunk); `auto`: fp64 where chunks go to
    whichever trainer is free (a TSP mode with several trainers or shard groups).
    """

    @property
    def step_wide(self) -> bool:
        """Whether an advantage needs every reward of the step (``std_mode=global`` or ``adv_baseline=batch``;
        ``algo.deferred_std``), the pipelined modes then defer a round's heads to the commit."""
        return self.std_mode == "global" or self.adv_baseline == "batch"

    @property
    def reward_mix(self) -> str:
        """``reward_aggregation`` in effect: the key, else the algorithm's reference (MixGRPO's advantage_aggr for
        mixgrpo: "advantages"; DanceGRPO's per-reward losses otherwise: "losses")."""
        if self.reward_aggregation is not None:
            return self.reward_aggregation
        return "advantages" if self.algorithm == "mixgrpo" else "losses"
