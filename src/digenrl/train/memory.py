"""The memory plan: bytes per trainer rank of a config, before anything is loaded (pure Python, no torch).

Per rank (``N`` = ranks the state is sharded over: 1 without sharding, ``runtime.trainers / train.shard_groups`` under FSDP)::

    weights   = (trainable * b_master + frozen * b_model) / N        b_master = 4 under mixed precision,
    grads     = trainable * b_master / N                                 else the load dtype (LoRA: always 4)
    grad_sums = trainable * 8 / N   the float64 sums of train.grad_sum=fp64 (control.run_plan.grad_sum_fp64)
    optimizer = 2 * trainable * b_master / N                          (AdamW exp_avg, exp_avg_sq)
    ema       = trainable * b_master / N                              (train.ema_decay set)
    copies    = c * trainable * b_master / N   c trainable-sized shadows (``train.ema.ParamCopy``): DiffusionNFT's
                                            soft old policy (train.nft_old_policy=soft) and the step-start
                                            snapshot of train.old_logprob=recompute with several rounds a step
    inference_copy = params * b_model + vae + text   a whole policy as a generator holds it, kept by each rank of
                                            a shard group that generates with tuning.tag_inference_copy
    reference = params * b_master / N   only for full fine-tuning with beta_kl > 0 (LoRA: adapters disabled)
    cast      = 2 * (fp32 weights used by matmuls)   mixed precision without FSDP: autocast keeps the 16-bit
                                                  copy of every weight for backward (none with recomputation,
                                                  where the cache is off and one block is recast at a time)
    gathered  = 2 blocks of unsharded 16-bit weights + 1 block of unsharded fp32 grads (FSDP working set)
    vae, text = frozen VAE (fp32) and, without a prompt cache, the text encoders (load dtype)
    acts      = acts(cells) (a chunk of ``cells`` cells in one forward/backward, below)
    total     = sum + reserve                                        (CUDA context, allocator slack)

Activations of one cell (one sample's forward, twice with CFG in training), for ``T_i`` latent tokens and
``T_t`` text tokens::

    A_cell  = fwd * [ sum_kind n_kind * (a_kind T_i + t_kind T_t + c_kind) + other ] + transient
    A_cell' = fwd * [ sum_kind n_kind * h * (T_i + T_t) * b_res + other + max_kind block ]
                                                                      (activation recomputation per block)
    acts(c) = c * A_cell + max(largest trainable tensor * b_master, c * fwd * 0.6 * max_kind block)
              (backward transients: a weight's fresh gradient before it is accumulated; the gradients of the
              block being differentiated; both measured)

Sequence parallelism (``train.sequence_parallel`` = d, ``runtime.generator_sequence_parallel``): a rank holds
``ceil(T_i / d)`` latent tokens of every sample and all ``T_t`` text tokens, so ``T_i`` above is the rank's
share; the state items are unchanged (each rank of a lane holds what an unsplit rank holds, or its FSDP shard
of a group that counts the lane's ranks). The Ulysses all-to-all buffers are per-token tensors that take the
place of the attention's own saved ones: measured at the published widths (1 block of each kind, LoRA r=16,
bf16, 144 latent + 32 text tokens, batch 2, 2 gloo ranks), the plan's activation error is the same split and
unsplit (Wan +14% / +12.5%, HunyuanVideo -4.9% / -4.6%; ``tests/train/test_memory_plan.py``).

``a_kind, t_kind, c_kind`` are saved-for-backward bytes per latent token, per text token and per forward of
one block, measured at the published widths on CPU with ``models.memory_probe.fit_per_token`` (one block of
each kind, fp32 and CPU bf16 autocast, full fine-tuning and LoRA r=64, diffusers 0.42.1); LoRA of another rank
adds ``(r - 64) * targets * b_act`` per token and block. The bytes are exactly linear in the token counts
(flash-style attention). ``tests/train/test_memory_plan.py`` compares the plan with allocation-counted peaks.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from digenrl.models.specs import SPECS, ModelSpec

GiB = 1024 ** 3


@dataclass(frozen=True)
class Block:
    count: int
    params: int
    lora_targets: int  # LoRA target linears of the family default (``models.lora.FAMILY_TARGETS``)
    lora_r64: int  # LoRA parameters of one block at rank 64 (scales linearly with the rank)
    # saved bytes per (latent token, text token, forward) of one block, per mode
    full32: tuple[float, float, float]
    full16: tuple[float, float, float]
    lora32: tuple[float, float, float]
    lora16: tuple[float, float, float]
    tokens: str = "both"  # "both" | "text" (the text refiner of HunyuanVideo)


@dataclass(frozen=True)
class Family:
    """A family's measured activation coefficients (``Block``, ``other``) beside its facts from the one registry
    (``models.specs``: parameters, width, default text length, latent geometry, text encoders, VAE)."""

    spec: ModelSpec
    blocks: dict[str, Block]
    other: dict[str, tuple[float, float, float]]  # embedders and output layer, per mode
    largest_tensor: int  # elements of the largest weight matrix
    params: int = 0  # 0: the spec's (``with_layers`` changes it)

    def __post_init__(self) -> None:
        if not self.params:
            object.__setattr__(self, "params", self.spec.arch.params)

    @property
    def hidden(self) -> int:
        return self.spec.hidden

    def with_layers(self, counts: dict[str, int]) -> "Family":
        """The same family with other block counts (the probe's few-layer models)."""
        blocks = {k: replace(b, count=counts.get(k, b.count)) for k, b in self.blocks.items()}
        params = self.params + sum((blocks[k].count - b.count) * b.params for k, b in self.blocks.items())
        return replace(self, blocks=blocks, params=params)

    def tokens(self, height: int, width: int, frames: int = 1) -> int:
        """Latent tokens of one sample (``ModelSpec.latent_tokens``)."""
        return self.spec.latent_tokens(height, width, frames)


# Activation coefficients and per-block counts, measured with ``models.memory_probe`` on the diffusers classes
# built from ``models.specs`` (parameters per block, largest tensors, LoRA parameters of ``models.lora.FAMILY_TARGETS``
# per block: counted on the meta device; the family's parameters are its spec's, ``models.flops``).
FAMILIES: dict[str, Family] = {
    "flux": Family(
        SPECS["flux"],
        {"transformer_blocks": Block(19, 339_831_296, 12, 7_077_888, (296240, 296240, 233472), (173352, 173352, 116736),
                                     (211752, 211752, 172032), (137252, 137252, 86016)),
         "single_transformer_blocks": Block(38, 141_591_808, 3, 1_179_648, (258344, 258344, 61440), (153892, 153892, 30720),
                                            (148520, 148520, 49152), (98980, 98980, 24576))},
        {"full32": (37128, 28672, 103424), "full16": (18564, 14336, 51712),
         "lora32": (12296, 12288, 12288), "lora16": (6148, 6144, 6144)},
        56_623_104),
    "sd3": Family(
        SPECS["sd3"],
        # activations measured on layer 0 (dual attention, layers 0-12): an upper bound for the 11 others;
        # parameters: the mean block (layers are 54M-102M)
        {"transformer_blocks": Block(24, 92_653_957, 8, 1_572_864, (215632, 74024, 98304), (148040, 52516, 49152),
                                     (81192, 50208, 61440), (59172, 40608, 30720))},
        {"full32": (18696, 16384, 46080), "full16": (9348, 8192, 23040),
         "lora32": (6152, 0, 6144), "lora16": (3076, 0, 3072)},
        21_233_664),
    "wan": Family(
        SPECS["wan"],
        {"blocks": Block(40, 351_394_304, 8, 5_242_880, (562532, 102404, 163840), (404836, 71684, 81920),
                         (324444, 82436, 143360), (255068, 61700, 71680))},
        {"full32": (61704, 57344, 103424), "full16": (51336, 28672, 51712),
         "lora32": (20488, 0, 20480), "lora16": (20488, 0, 10240)},
        157_286_400),
    "qwen_image": Family(
        SPECS["qwen_image"],
        {"transformer_blocks": Block(60, 339_831_296, 12, 7_077_888, (295732, 295220, 2330624), (191274, 190762, 1165312),
                                     (211244, 210732, 2269184), (149030, 148518, 1134592))},
        {"full32": (37128, 28672, 50176), "full16": (18564, 21504, 25088),
         "lora32": (12296, 0, 12288), "lora16": (6148, 0, 6144)},
        56_623_104),
    "hunyuan_video": Family(
        SPECS["hunyuan_video"],
        {"transformer_blocks": Block(20, 339_831_296, 8, 3_145_728, (296244, 295220, 233472), (191786, 190762, 116736),
                                     (149804, 161076, 184320), (118566, 123690, 92160)),
         "single_transformer_blocks": Block(40, 141_591_808, 3, 1_179_648, (270636, 270636, 61440), (172326, 172326, 30720),
                                            (148524, 148524, 49152), (111270, 111270, 24576)),
         "refiner_blocks": Block(2, 132_166_656, 4, 1_572_864, (0, 227440, 0), (0, 113776, 0), (0, 130152, 0), (0, 83560, 0),
                                 tokens="text")},
        {"full32": (37128, 28672, 169984), "full16": (18564, 14336, 84992),
         "lora32": (12296, 12288, 12288), "lora16": (6148, 6144, 6144)},
        56_623_104),
}  # fmt: skip

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class MemoryPlanError(ValueError):
    """A config whose plan exceeds the memory it is planned for; the message has the numbers and the keys."""


@dataclass(frozen=True)
class PlanInputs:
    """Everything the plan depends on (``inputs_from_config`` derives it from a ``Config``)."""

    family: str
    height: int = 512
    width: int = 512
    frames: int = 1
    text_tokens: int | None = None  # None: the family default
    lora_rank: int | None = None  # None: full fine-tuning
    model_dtype: str = "bfloat16"
    mixed_precision: str = "none"  # none | bf16 | fp16
    activation_checkpointing: bool = False
    sharding: str = "none"  # none | fsdp
    cpu_offload: bool = False  # fsdp: the sharded state lives in host memory
    ranks: int = 1
    beta_kl: float = 0.0
    ema: bool = False
    forwards_per_cell: int = 1  # 2 with CFG in training
    text_encoders: bool = False  # loaded on the trainer (no prompt cache)
    vae: bool = True
    reserve_gb: float = 3.0
    layers: dict[str, int] = field(default_factory=dict)  # block count overrides (probes)
    sequence_parallel: int = 1  # ranks that split each sample's latent tokens (a lane of train.sequence_parallel)
    grad_sums: bool = False  # float64 gradient sums (train.grad_sum in effect fp64)
    param_copies: int = 0  # trainable-sized shadows: nft soft old policy, recompute's step-start snapshot
    inference_copy: bool = False  # an unsharded replica beside the shards (tuning.tag_inference_copy)


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per rank by item; ``total(cells)`` adds the activations of a chunk of ``cells`` cells."""

    items: dict[str, float]
    act_cell: float  # saved-for-backward bytes per cell
    act_block: float  # backward transient per cell (gradients of the block being differentiated)
    act_fixed: float  # backward transient independent of the chunk (a weight's gradient before accumulation)

    @property
    def state(self) -> float:
        return sum(self.items.values())

    def sampling_state(self, mid_step: bool = False) -> float:
        """Bytes held while the rank samples: ``state`` less autocast's weight copies (a backward's only) and,
        unless it samples ``mid_step`` (a TAG gang, beside the step's gradients), the gradients and their float64
        sums, which the commit freed."""
        freed = ("cast",) if mid_step else ("cast", "grads", "grad_sums")
        return self.state - sum(self.items.get(k, 0.0) for k in freed)

    def activations(self, cells: int) -> float:
        return cells * self.act_cell + max(self.act_fixed, cells * self.act_block)

    def total(self, cells: int) -> float:
        return self.state + self.activations(cells)

    def max_cells(self, capacity_bytes: float, limit: int = 1 << 20) -> int:
        """Largest chunk (cells) that fits in ``capacity_bytes``; 0 when not even one does."""
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.total(mid) <= capacity_bytes else (lo, mid - 1)
        return lo

    def table(self, cells: int) -> str:
        rows = [f"{k}={v / GiB:.1f}" for k, v in self.items.items() if v > 0]
        rows.append(f"activations({cells} cells x {self.act_cell / GiB:.2f})={self.activations(cells) / GiB:.1f}")
        return ", ".join(rows) + f"; total {self.total(cells) / GiB:.1f} GiB"


def _act_mode(p: PlanInputs) -> tuple[str, float]:
    """(coefficient set, bytes per activation element)."""
    lora = "lora" if p.lora_rank else "full"
    if p.mixed_precision != "none":
        return lora + "16", 2.0
    return lora + "32", float(DTYPE_BYTES[p.model_dtype])  # plain 16-bit weights: every activation is 16-bit


def _tokens(fam: Family, p: PlanInputs) -> tuple[int, int]:
    """(latent tokens a rank holds of one sample: all of them, or ceil(T_i / d) under sequence parallelism; text
    tokens)."""
    return (-(-fam.tokens(p.height, p.width, p.frames) // p.sequence_parallel),
            fam.spec.text_tokens() if p.text_tokens is None else p.text_tokens)


def _frozen_items(fam: Family, p: PlanInputs) -> dict[str, float]:
    """The frozen VAE (fp32), the text encoders (load dtype) where loaded, and the reserve."""
    return {"vae": fam.spec.vae_params * 4 if p.vae else 0.0,
            "text_encoders": fam.spec.text_encoder_params * DTYPE_BYTES[p.model_dtype] if p.text_encoders else 0.0,
            "reserve": p.reserve_gb * GiB}


def _saved(coef: tuple[float, float, float], mode: str, elem: float, ti: int, tt: int) -> float:
    """a T_i + t T_t + c, halved where fp32-measured coefficients apply to 16-bit activations."""
    a, t, c = coef
    return (a * ti + t * tt + c) * (0.5 if (mode.endswith("32") and elem == 2.0) else 1.0)


def _block_bytes(b: Block, mode: str, elem: float, p: PlanInputs, ti: int, tt: int) -> float:
    per = _saved(getattr(b, mode), mode, elem, ti, tt)
    if p.lora_rank:
        per += (p.lora_rank - 64) * b.lora_targets * elem * (tt if b.tokens == "text" else ti + tt)
    return per


def plan_memory(p: PlanInputs) -> MemoryPlan:
    """The per-rank memory plan of ``p`` (see the module docstring for every formula)."""
    if p.family not in FAMILIES:
        raise ValueError(f"memory plan: unknown family {p.family!r}; known: {sorted(FAMILIES)}")
    fam = FAMILIES[p.family].with_layers(p.layers)
    n = p.ranks if p.sharding == "fsdp" else 1
    b_model = DTYPE_BYTES[p.model_dtype]
    b_master = 4 if p.mixed_precision != "none" else b_model
    lora = p.lora_rank is not None
    lora_params = sum(b.count * b.lora_r64 for b in fam.blocks.values()) * (p.lora_rank or 0) / 64
    trainable, b_train = (lora_params, 4) if lora else (fam.params, b_master)
    frozen = fam.params if lora else 0.0
    items = {
        "weights": (trainable * b_train + frozen * b_model) / n,
        "grads": trainable * b_train / n,
        "grad_sums": trainable * 8 / n if p.grad_sums else 0.0,
        "optimizer": 2 * trainable * b_train / n,
        "ema": trainable * b_train / n if p.ema else 0.0,
        "copies": p.param_copies * trainable * b_train / n,
        "reference": fam.params * b_train / n if (p.beta_kl > 0 and not lora) else 0.0,
    }
    if p.sharding == "fsdp" and p.cpu_offload:  # host memory, not the GPU's
        items = {k: 0.0 for k in items}
    biggest = max(b.params for b in fam.blocks.values())
    if p.sharding == "fsdp":
        items["gathered"] = 2 * biggest * (2 if p.mixed_precision != "none" else b_model) + (0 if lora else biggest * 4)
    elif p.mixed_precision != "none" and not p.activation_checkpointing:
        cast = (lora_params + (fam.params if b_model == 4 else 0)) if lora else fam.params
        items["cast"] = 2 * cast
    items.update(_frozen_items(fam, p))
    if p.inference_copy:  # a whole policy, as a generator's (on the GPU even with cpu_offload: it generates there)
        items["inference_copy"] = fam.params * b_model + items["vae"] + items["text_encoders"]

    mode, elem = _act_mode(p)
    ti, tt = _tokens(fam, p)
    per_block = {k: _block_bytes(b, mode, elem, p, ti, tt) for k, b in fam.blocks.items()}
    other = _saved(fam.other[mode], mode, elem, ti, tt)
    largest_block = max(per_block.values())
    if p.activation_checkpointing:
        res = 4.0  # the residual stream between blocks stays fp32 under autocast (fp32 inputs, fp32 gates)
        if p.mixed_precision == "none" and b_model == 2:
            res = 2.0
        inputs = sum(b.count * fam.hidden * ((tt if b.tokens == "text" else ti + tt)) * res for b in fam.blocks.values())
        act_cell = p.forwards_per_cell * (inputs + other + largest_block)
    else:
        act_cell = p.forwards_per_cell * (sum(fam.blocks[k].count * v for k, v in per_block.items()) + other)
    grad_transient = 0.0 if lora else fam.largest_tensor * b_train
    return MemoryPlan(items, act_cell, 0.6 * largest_block * p.forwards_per_cell, grad_transient)


def samples_that_fit(capacity: float, fixed: float, per: float) -> int:
    """The most samples n with fixed + n x per <= capacity (bytes): 0 when not one fits, ``1 << 20`` when a sample
    costs nothing."""
    return max(0, int((capacity - fixed) // per)) if per > 0 else 1 << 20


def generator_bytes(p: PlanInputs, samples: int) -> dict[str, float]:
    """Per generator: the 16-bit replica, VAE, text encoders (without a full prompt cache), reserve, and the
    sampling activations of ``samples`` trajectories (no-grad forwards keep nothing for backward; bounded by
    the largest block's saved bytes per sample, times 2 with CFG). VAE decoding memory is not included (set
    ``model.options.vae_batch`` / ``vae_tiling`` for video)."""
    fam = FAMILIES[p.family]
    mode, elem = _act_mode(replace(p, lora_rank=None, mixed_precision="none"))
    ti, tt = _tokens(fam, p)
    block = max(_block_bytes(b, mode, elem, replace(p, lora_rank=None), ti, tt) for b in fam.blocks.values())
    return {"weights": fam.params * DTYPE_BYTES[p.model_dtype], **_frozen_items(fam, p),
            "activations": samples * p.forwards_per_cell * block}
