"""Model, GPU and testbed presets for the analytic cost model, with the source of every number.

Nothing here is fitted to any speedup: parameter counts and shapes come from model cards / released configs,
GPU numbers from vendor datasheets (dense BF16 tensor throughput, i.e. without 2:4 sparsity).
"""

from __future__ import annotations

from dataclasses import dataclass

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
    """A flow-matching transformer. ``arch``: its key in ``sim.flops.ARCHS`` (per-stream parameter counts and
    attention layers from the diffusers config). ``joint_text``: text tokens share the self-attention sequence
    (MM-DiT); otherwise text enters by cross-attention. ``forwards_per_step``: 2 with true CFG (cond +
    uncond), 1 for guidance-distilled models."""

    name: str
    arch: str
    text_tokens: int
    joint_text: bool
    forwards_per_step: int
    video: bool
    spatial_down: int = 8          # VAE spatial compression
    temporal_down: int = 1         # VAE temporal compression (video: 4, first frame kept)
    patch: int = 2                 # spatial patchify of latents
    latent_channels: int = 16
    vae_flop_per_px: float = 9.59e6     # VAE decoder FLOPs per output pixel (per pixel-frame for video)
    reward_tflop: float = 0.38          # reward model FLOPs per sample (TFLOP)
    text_dim: int = 4096                # width of the cached prompt embeddings shipped with a trajectory
    source: str = ""

    @property
    def archi(self):
        from .flops import ARCHS

        return ARCHS[self.arch]

    @property
    def layers(self) -> int:
        return sum(n for n, kind in self.archi.attn if kind in ("joint", "img"))

    @property
    def hidden(self) -> int:
        return self.archi.d_attn


# VAE decoders: FLOPs counted with torch.utils.flop_counter on the diffusers decoders (meta device; checked
# by tests/sim/test_sim_flops.py): FLUX/SD3 AutoencoderKL (16 latent channels) 2.515 TFLOP per 512x512 image
# = 9.59 MFLOP per pixel; Wan2.1 AutoencoderKLWan 112.75 TFLOP for 33 x 480 x 832 = 8.56 MFLOP per pixel-frame
# (10.85 MFLOP per pixel for a single 512x512 frame, as Qwen-Image uses it); HunyuanVideo
# AutoencoderKLHunyuanVideo 237.3 TFLOP for 33 x 480 x 848 = 17.67 MFLOP per pixel-frame (untiled).
# Rewards: images scored by PickScore (CLIP ViT-H/14: 0.38 TFLOP per image+prompt, counted the same way on
# the transformers CLIPModel); videos by a ~2B VLM reward (VideoAlign class, Qwen2-VL-2B) over sampled frames,
# ~2 x 2e9 params x 2000 tokens = ~8 TFLOP (an estimate: no counted model).
MODELS: dict[str, ModelPreset] = {
    # FLUX.1-dev: T5 prompt up to 512 tokens (diffusers default max_sequence_length); guidance-distilled.
    "flux": ModelPreset("FLUX.1-dev", "flux", 512, True, 1, False, vae_flop_per_px=9.59e6,
                        reward_tflop=0.38, source="black-forest-labs/FLUX.1-dev model card and config.json"),
    # Wan2.1-T2V-14B: umT5 text (512 tokens) by cross-attention; Wan-VAE 4x8x8, patch (1, 2, 2); CFG (2 fwd).
    "wan": ModelPreset("Wan2.1-T2V-14B", "wan", 512, False, 2, True, temporal_down=4,
                       vae_flop_per_px=8.56e6, reward_tflop=8.0,
                       source="Wan-AI/Wan2.1-T2V-14B model card and config.json"),
    # HunyuanVideo: LLM text features (256 tokens, joint attention); causal 3D VAE 4x8x8, patch (1, 2, 2);
    # guidance-distilled ("embedded guidance"), 1 forward per step.
    "hunyuan": ModelPreset("HunyuanVideo-13B", "hunyuan", 256, True, 1, True, temporal_down=4,
                           vae_flop_per_px=17.67e6, reward_tflop=8.0,
                           source="tencent/HunyuanVideo model card and config.json"),
    # Qwen-Image: Qwen2.5-VL text features (joint attention, ~256 tokens); Wan-2.1 VAE (8x spatial), patch 2;
    # true CFG (2 forwards).
    "qwen-image": ModelPreset("Qwen-Image-20B", "qwen-image", 256, True, 2, False, vae_flop_per_px=10.85e6,
                              reward_tflop=0.38, text_dim=3584,
                              source="Qwen/Qwen-Image model card and config.json"),
}


PUBLISH_PATHS = ("object_store", "broadcast", "stream")  # runtime.publish


@dataclass(frozen=True)
class Training:
    """How the trainer pool trains and publishes (what the runtime does, per config).

    ``lora_rank`` 0: full fine-tuning; r > 0: LoRA adapters of rank r on every token-stream linear layer of the
    blocks (the base stays frozen in bf16). ``sharded``: FSDP full sharding over the trainer pool (bf16
    params, fp32 master and Adam moments sharded; gradients kept unsharded under ``no_sync`` until the commit's
    reduce-scatter); otherwise every rank keeps a replica and the commit all-reduces the gradients (the
    runtime's trainer). ``publish``: ``object_store`` (the runtime's default: rank 0 copies the trainable state
    to host, puts it in the Ray object store, every generator node fetches it and each generator loads it) or
    ``broadcast`` (pipelined link-rate broadcast) or ``stream`` (each sending rank broadcasts its own shard,
    the trainers go on while the generators receive). ``recompute``: activation checkpointing (one extra forward
    per cell, only the layer inputs are kept). ``tag_copy``: TAG on a shard group first all-gathers a bf16
    inference copy (``runtime.tag_inference_copy``), so its ranks generate their shares of a gang without
    per-forward gathers (only where the copy fits beside the training state). ``shard_groups`` k (sharded only):
    hybrid sharding, the pool as k shard groups of N / k ranks, data-parallel replicas of each other, each one
    trainer of the scheduler (``train.shard_groups``); the commit all-reduces the gradient shards across them."""

    lora_rank: int = 0
    sharded: bool = True
    publish: str = "object_store"
    recompute: bool = True
    tag_copy: bool = False
    shard_groups: int = 1

    def __post_init__(self) -> None:
        if self.lora_rank < 0:
            raise PresetError(f"training.lora_rank: must be >= 0 (got {self.lora_rank})")
        if self.publish not in PUBLISH_PATHS:
            raise PresetError(f"training.publish: {self.publish!r} is not one of {', '.join(PUBLISH_PATHS)}")
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
    "flux": Workload(16, 16, 512, 512, 1),
    "qwen-image": Workload(16, 16, 512, 512, 1),
    "hunyuan": Workload(8, 12, 848, 480, 33),
    "wan": Workload(8, 12, 832, 480, 33),
}


def model_preset(name: str) -> ModelPreset:
    try:
        return MODELS[name]
    except KeyError:
        raise PresetError(f"--model: unknown model {name!r} (choose from {', '.join(MODELS)})") from None


def testbed_preset(name: str) -> Testbed:
    try:
        return TESTBEDS[name]
    except KeyError:
        raise PresetError(f"--testbed: unknown testbed {name!r} (choose from {', '.join(TESTBEDS)})") from None


def tokens_per_sample(m: ModelPreset, w: Workload) -> tuple[int, int]:
    """(latent tokens, latent frames): frames -> 1 + (frames - 1) / temporal_down latent frames, each of
    (H / (down * patch)) x (W / (down * patch)) tokens."""
    lf = 1 + (w.frames - 1) // m.temporal_down if m.video else 1
    per = (w.height // (m.spatial_down * m.patch)) * (w.width // (m.spatial_down * m.patch))
    return lf * per, lf
