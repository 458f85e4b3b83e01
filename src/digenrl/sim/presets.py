"""Model, GPU and testbed presets for the analytic cost model, with the source of every number.

Nothing here is fitted to any speedup: parameter counts and shapes come from model cards / released configs,
GPU numbers from vendor datasheets (dense BF16 tensor throughput, i.e. without 2:4 sparsity).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..models.specs import ALIASES, SPECS, ModelSpec, canonical
from .algorithms import Algorithm


class PresetError(ValueError):
    """Unknown preset; the message names the option and the valid values."""


@dataclass(frozen=True)
class GPU:
    name: str
    bf16_tflops: float   # dense BF16 tensor-core peak, TFLOP/s
    hbm_gbs: float       # memory bandwidth, GB/s
    memory_gb: float
    pcie_gbs: float = 32.0   # host link, GB/s per direction (PCIe Gen4 x16: 32, Gen5 x16: 64)
    nvlink_gbs: float = 0.0  # NVLink per GPU, GB/s as datasheets state it (both directions); 0: no NVLink

    @property
    def intra_node_gbs(self) -> float:
        """GB/s one GPU sends to the others of its node, one direction: half the datasheet's bidirectional
        NVLink figure, or the PCIe link (``pcie_gbs``) where the part has no NVLink (peer-to-peer over PCIe)."""
        return self.nvlink_gbs / 2.0 if self.nvlink_gbs > 0 else self.pcie_gbs


# NVIDIA L40S datasheet: BF16 tensor 362.05 TFLOPS dense (733 with sparsity), 48 GB GDDR6, 864 GB/s,
# PCIe Gen4 x16 (64 GB/s bidirectional).
L40S = GPU("L40S-48GB", 362.05, 864.0, 48.0, 32.0)
# NVIDIA H100 SXM5 datasheet: BF16 tensor 989 TFLOPS dense (1,979 with sparsity), 80 GB HBM3, 3.35 TB/s,
# PCIe Gen5 x16 (128 GB/s bidirectional), NVLink 900 GB/s (4th generation, HGX board).
H100 = GPU("H100-SXM-80GB", 989.0, 3350.0, 80.0, 64.0, 900.0)
# NVIDIA H20 (export-compliant Hopper; OEM spec sheet as widely reported): FP16/BF16 148 TFLOPS dense
# (296 with sparsity), 96 GB HBM3, 4.0 TB/s, PCIe Gen5 x16, NVLink 900 GB/s (HGX H20 board).
H20 = GPU("H20-96GB", 148.0, 4000.0, 96.0, 64.0, 900.0)
# GPUs that appear only in the public measurements the efficiencies are fitted to (sim/efficiency.py):
# NVIDIA A100 SXM4 80GB datasheet: BF16 tensor 312 TFLOPS dense, 2,039 GB/s, PCIe Gen4, NVLink 600 GB/s.
A100 = GPU("A100-SXM-80GB", 312.0, 2039.0, 80.0, 32.0, 600.0)
# NVIDIA H200 SXM datasheet: BF16 tensor 989 TFLOPS dense (same SMs as H100 SXM), 141 GB HBM3e, 4.8 TB/s,
# NVLink 900 GB/s.
H200 = GPU("H200-SXM-141GB", 989.0, 4800.0, 141.0, 64.0, 900.0)
# NVIDIA L20 (Ada AD102, export-compliant; OEM spec sheet as widely reported): FP16/BF16 tensor 119.5 TFLOPS
# dense, 48 GB GDDR6, 864 GB/s, PCIe Gen4. Same SM architecture and kernels as the L40S.
L20 = GPU("L20-48GB", 119.5, 864.0, 48.0, 32.0)


@dataclass(frozen=True)
class Testbed:
    """A cluster: ``count`` x ``gpu``, plus ``count2`` x ``gpu2`` when heterogeneous. Disaggregated runs may
    put either kind in either pool (``assignments``); pools never mix kinds. GPUs sit in nodes of
    ``node_gpus``, each GPU with its own NIC of ``net_gbit`` (rail-optimised HGX / PCIe servers); inside a node
    they talk at the GPU's ``intra_node_gbs`` (NVLink, or PCIe without it). ``sim.comm`` prices a collective
    from where its ranks sit."""

    name: str
    gpu: GPU
    count: int
    net_gbit: float                    # per-GPU network bandwidth (one NIC per GPU), Gb/s
    gpu2: GPU | None = None
    count2: int = 0
    description: str = ""
    node_gpus: int = 8                 # GPUs per node (HGX boards and 8-GPU PCIe servers)

    @property
    def heterogeneous(self) -> bool:
        return self.gpu2 is not None

    @property
    def total(self) -> int:
        return self.count + self.count2

    @property
    def net_bytes_s(self) -> float:
        return self.net_gbit * 1e9 / 8.0

    def assignments(self) -> list[tuple[GPU, int, GPU, int]]:
        """(generator GPU, max generators, trainer GPU, max trainers) options."""
        if not self.heterogeneous:
            return [(self.gpu, self.count, self.gpu, self.count)]
        return [(self.gpu, self.count, self.gpu2, self.count2), (self.gpu2, self.count2, self.gpu, self.count)]

    def weakest(self) -> GPU:
        """The pace and memory of a lock-step job spanning both kinds (each field at its minimum)."""
        if not self.heterogeneous:
            return self.gpu
        a, b = self.gpu, self.gpu2
        return GPU(f"min({a.name},{b.name})", min(a.bf16_tflops, b.bf16_tflops), min(a.hbm_gbs, b.hbm_gbs),
                   min(a.memory_gb, b.memory_gb), min(a.pcie_gbs, b.pcie_gbs), min(a.nvlink_gbs, b.nvlink_gbs))


TESTBEDS: dict[str, Testbed] = {
    # 8 GPUs per node everywhere (HGX boards; 8-GPU PCIe servers for the L40S, whose GPUs talk over PCIe).
    # A: 32 x 48 GB with 200 Gb/s per GPU (e.g. ConnectX-6 HDR / 200GbE): L40S-class PCIe servers.
    "A": Testbed("A", L40S, 32, 200.0, description="32 x L40S 48 GB, 200 Gb/s"),
    # B: 32 x 80 GB with 400 Gb/s per GPU (ConnectX-7 NDR): H100 SXM (HGX) nodes.
    "B": Testbed("B", H100, 32, 400.0, description="32 x H100 SXM 80 GB, 400 Gb/s"),
    # C: 16 x 96 GB on 200 Gb/s HDR InfiniBand: H20 nodes.
    "C": Testbed("C", H20, 16, 200.0, description="16 x H20 96 GB, 200 Gb/s HDR IB"),
    # A+C: the two clusters joined at 200 Gb/s; each pool is on one kind (the planner tries both ways round).
    "A+C": Testbed("A+C", L40S, 32, 200.0, gpu2=H20, count2=16,
                   description="32 x L40S 48 GB + 16 x H20 96 GB, 200 Gb/s"),
    # D: one HGX H200 node (8 x H200 SXM, NVLink 900 GB/s, 400 Gb/s NICs): the anchors' VeRL-Omni figure ran on
    # 4 H200s (benchmarks/anchors.py) and the lent device is one H200.
    "D": Testbed("D", H200, 8, 400.0, description="8 x H200 SXM 141 GB (one HGX node), 400 Gb/s"),
}


@dataclass(frozen=True)
class ModelPreset:
    """A flow-matching transformer as the roofline prices it: its facts from the one registry (``models.specs``:
    the published config, whose closed forms ``models.flops`` give the per-stream parameters and attention
    layers; text by joint attention or cross-attention; the VAE) and what a run sets: ``text_tokens`` (the
    config's ``model.options.max_sequence_length``, SD3's 77 CLIP tokens included), ``forwards_per_step`` (2 with
    true CFG, 1 for guidance-distilled models) and the reward model's FLOPs per sample (``reward_tflop``)."""

    spec: ModelSpec
    text_tokens: int
    forwards_per_step: int
    reward_tflop: float

    def __getattr__(self, name: str):
        """The registry's facts (``name``, ``video``, ``joint_text``, ``hidden``, ``source``, ...) from ``spec``."""
        if name == "spec" or name.startswith("__"):  # (not set yet: a copy or unpickling probing the instance)
            raise AttributeError(name)
        return getattr(self.spec, name)

    @property
    def archi(self):
        return self.spec.arch

    @property
    def layers(self) -> int:
        """Self-attention layers (joint or image stream): the all-to-alls of sequence parallelism."""
        return self.archi.attention_layers("joint", "img")


# Rewards: images scored by PickScore (CLIP ViT-H/14: 0.38 TFLOP per image+prompt, counted with
# torch.utils.flop_counter on the transformers CLIPModel); videos by a ~2B VLM reward (VideoAlign class,
# Qwen2-VL-2B) over sampled frames, ~2 x 2e9 params x 2000 tokens = ~8 TFLOP (an estimate: no counted model).
IMAGE_REWARD_TFLOP, VIDEO_REWARD_TFLOP = 0.38, 8.0


def preset_of(spec: ModelSpec, text_tokens: int | None = None) -> ModelPreset:
    """The roofline's preset of a registry spec, with its default text length unless ``text_tokens`` is given."""
    return ModelPreset(spec, spec.text_tokens() if text_tokens is None else text_tokens, spec.forwards_per_step,
                       VIDEO_REWARD_TFLOP if spec.video else IMAGE_REWARD_TFLOP)


# One preset per family of the registry, by its one spelling (``model.kind``; ``model_preset`` also takes the
# documented aliases ``hunyuan``, ``qwen-image``, ``sd35-medium``).
MODELS: dict[str, ModelPreset] = {k: preset_of(s) for k, s in SPECS.items()}


PUBLISH_PATHS = ("object_store", "broadcast", "stream")  # runtime.publish


@dataclass(frozen=True)
class Training:
    """How the trainer pool trains and publishes (what the runtime does, per config).

    ``lora_rank`` 0: full fine-tuning; r > 0: LoRA adapters of rank r on every token-stream linear layer of the blocks
    (the base stays frozen in bf16). ``sharded``: FSDP full sharding over the trainer pool (bf16 params, fp32 master
    and Adam moments sharded; gradients kept unsharded under ``no_sync`` until the commit's reduce-scatter); otherwise
    every rank keeps a replica and the commit all-reduces the gradients (the runtime's trainer). ``publish``:
    ``object_store`` (the runtime's default), ``broadcast`` or ``stream`` (``runtime.publish``; each priced as
    ``sim.roofline`` says). ``recompute``: activation checkpointing (one extra forward per cell, only the layer inputs
    are kept). ``tag_copy``: TAG on a shard group first all-gathers a bf16 inference copy
    (``tuning.tag_inference_copy``), so its ranks generate their shares of a gang without per-forward gathers (only
    where the copy fits beside the training state). ``shard_groups`` k (sharded only): hybrid sharding, the pool as k
    shard groups of N / k ranks, data-parallel replicas of each other, each one trainer of the scheduler
    (``train.shard_groups``); the commit all-reduces the gradient shards across them. ``sequence_parallel`` d: every
    cell is trained by a lane of d ranks, each on 1 / d of the latent tokens (Ulysses: all-to-alls around every
    attention); a shard group of g ranks has g / d lanes, replicated trainers form groups of d ranks.
    ``generator_sequence_parallel`` d: a generator is d GPUs that denoise its fragment together."""

    lora_rank: int = 0
    sharded: bool = True
    publish: str = "object_store"
    recompute: bool = True
    tag_copy: bool = False
    shard_groups: int = 1
    sequence_parallel: int = 1            # Ulysses degree d of a trainer lane (train.sequence_parallel)
    generator_sequence_parallel: int = 1  # GPUs of one generator (runtime.generator_sequence_parallel)

    def __post_init__(self) -> None:
        if self.lora_rank < 0:
            raise PresetError(f"training.lora_rank: must be >= 0 (got {self.lora_rank})")
        if self.publish not in PUBLISH_PATHS:
            raise PresetError(f"training.publish: {self.publish!r} is not one of {', '.join(PUBLISH_PATHS)}")
        if self.sequence_parallel < 1 or self.generator_sequence_parallel < 1:
            raise PresetError("training.sequence_parallel: degrees must be >= 1")
        if self.shard_groups < 1 or (self.shard_groups > 1 and not self.sharded):
            raise PresetError(f"training.shard_groups: {self.shard_groups} needs >= 1 and, above 1, sharded training")


FULL_SHARDED = Training()
# The shipped GPU presets (configs/flux1_dev.yaml, configs/wan21_14b.yaml): LoRA on the runtime's replicated
# trainer, published through the object store.
LORA_REPLICATED = Training(lora_rank=64, sharded=False)


@dataclass(frozen=True)
class Workload:
    """One RL step's shape. Defaults follow Flow-GRPO / DanceGRPO recipes (see docs/simulation.md)."""

    prompts: int
    generations: int
    width: int
    height: int
    frames: int
    sampling_steps: int = 20
    timestep_fraction: float = 0.6   # Flow-GRPO's timestep_fraction
    training: Training = FULL_SHARDED
    algorithm: Algorithm = Algorithm()  # train.algorithm and its shape (``sim.algorithms``)
    # the share of a planned chunk's cells that train: train.best_of_n (n / G: the trainers drop the other
    # generations' cells before the forward) times 1 / M with train.minibatch_split=samples or generations (every
    # round plans every group and trains its part of the samples); a chunk of c cells runs ceil(c x share) cells
    trained_share: float = 1.0
    sample_batch: int | None = None  # sampler.batch_size: a worker samples in batches of at most this

    def __post_init__(self) -> None:
        if not 0.0 < self.trained_share <= 1.0:
            raise PresetError(f"workload.trained_share: must be in (0, 1] (got {self.trained_share})")

    @property
    def trained_timesteps(self) -> int:
        """S: int(T * fraction), at least 1 (as Flow-GRPO computes it); MixGRPO's window; DiffusionNFT's K."""
        return self.algorithm.trained(self.sampling_steps, self.timestep_fraction)

    @property
    def denoise_steps(self) -> int:
        """Denoising steps per sample: T; MixGRPO-Flash's mean over its window positions, rounded."""
        return max(self.trained_timesteps, round(self.algorithm.denoise_steps(self.sampling_steps)))


# Images: 16 prompts x 16 generations at 512 px (Flow-GRPO trains at 512). Video: 8 prompts x 12
# generations of 33 frames at 480p (848x480 / 832x480), the short-clip regime of GRPO video recipes.
WORKLOADS: dict[str, Workload] = {
    "sd3": Workload(16, 16, 512, 512, 1),
    "flux": Workload(16, 16, 512, 512, 1),
    "qwen_image": Workload(16, 16, 512, 512, 1),
    "hunyuan_video": Workload(8, 12, 848, 480, 33),
    "wan": Workload(8, 12, 832, 480, 33),
}


# The video models at their native size (issue 39), planned on 80 GB GPUs (docs/sequence_parallel.md): HunyuanVideo
# 720 x 1280 x 129 frames (33 x 45 x 80 = 118,800 latent tokens), Wan2.1 720p x 81 frames (21 x 45 x 80 = 75,600);
# the recipes' step (8 prompts x 12 generations), full fine-tuning on FSDP.
NATIVE: dict[str, tuple[str, Workload]] = {
    "hunyuan_video_native": ("hunyuan_video", Workload(8, 12, 1280, 720, 129)),
    "wan_native": ("wan", Workload(8, 12, 1280, 720, 81)),
}


def model_preset(name: str) -> ModelPreset:
    """``MODELS[name]``, ``name`` a ``model.kind`` or a documented alias (``models.specs.ALIASES``), or a native-size
    video preset (``NATIVE``)."""
    if name in NATIVE:
        return MODELS[NATIVE[name][0]]
    try:
        return MODELS[canonical(name)]
    except KeyError:
        raise PresetError(f"--model: unknown model {name!r} (choose from {', '.join(MODELS)}; aliases: "
                          f"{', '.join(ALIASES)}; native sizes: {', '.join(NATIVE)})") from None


def workload_preset(name: str) -> Workload:
    """``WORKLOADS[name]`` for a ``model.kind`` or a documented alias, or a native-size preset's workload."""
    return NATIVE[name][1] if name in NATIVE else WORKLOADS[canonical(name)]


def testbed_preset(name: str) -> Testbed:
    try:
        return TESTBEDS[name]
    except KeyError:
        raise PresetError(f"--testbed: unknown testbed {name!r} (choose from {', '.join(TESTBEDS)})") from None


def tokens_per_sample(m: ModelPreset, w: Workload) -> tuple[int, int]:
    """(latent tokens, latent frames) of one sample (``ModelSpec.latent_tokens``)."""
    return m.spec.latent_tokens(w.height, w.width, w.frames), m.spec.latent_frames(w.frames)
