"""Model, GPU and testbed presets for the analytic cost model, with the source of every number.

Nothing here is fitted to any speedup: parameter counts and shapes come from model cards / released configs,
GPU numbers from vendor datasheets (dense BF16 tensor throughput, i.e. without 2:4 sparsity).
"""

from __future__ import annotations

from dataclasses import dataclass


class PresetError(ValueError):
    """Unknown preset; the message names the option and the valid values."""


@dataclass(frozen=True)
class GPU:
    name: str
    bf16_tflops: float   # dense BF16 tensor-core peak, TFLOP/s
    hbm_gbs: float       # memory bandwidth, GB/s
    memory_gb: float


# NVIDIA L40S datasheet: BF16 tensor 362.05 TFLOPS dense (733 with sparsity), 48 GB GDDR6, 864 GB/s.
L40S = GPU("L40S-48GB", 362.05, 864.0, 48.0)
# NVIDIA H100 SXM5 datasheet: BF16 tensor 989 TFLOPS dense (1,979 with sparsity), 80 GB HBM3, 3.35 TB/s.
H100 = GPU("H100-SXM-80GB", 989.0, 3350.0, 80.0)
# NVIDIA H20 (export-compliant Hopper; OEM spec sheet as widely reported): FP16/BF16 148 TFLOPS dense
# (296 with sparsity), 96 GB HBM3, 4.0 TB/s.
H20 = GPU("H20-96GB", 148.0, 4000.0, 96.0)


@dataclass(frozen=True)
class Testbed:
    """A cluster: ``count`` x ``gpu``, plus ``count2`` x ``gpu2`` when heterogeneous. Disaggregated runs may
    put either kind in either pool (``assignments``); pools never mix kinds."""

    name: str
    gpu: GPU
    count: int
    net_gbit: float                    # per-GPU network bandwidth, Gb/s (collectives and weight pushes)
    gpu2: GPU | None = None
    count2: int = 0
    description: str = ""

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
                   min(a.memory_gb, b.memory_gb))


TESTBEDS: dict[str, Testbed] = {
    # A: 32 x 48 GB with 200 Gb/s per GPU (e.g. ConnectX-6 HDR / 200GbE): L40S-class PCIe servers.
    "A": Testbed("A", L40S, 32, 200.0, description="32 x L40S 48 GB, 200 Gb/s"),
    # B: 32 x 80 GB with 400 Gb/s per GPU (ConnectX-7 NDR): H100 SXM (HGX) nodes.
    "B": Testbed("B", H100, 32, 400.0, description="32 x H100 SXM 80 GB, 400 Gb/s"),
    # C: 16 x 96 GB on 200 Gb/s HDR InfiniBand: H20 nodes.
    "C": Testbed("C", H20, 16, 200.0, description="16 x H20 96 GB, 200 Gb/s HDR IB"),
    # A+C: the two clusters joined at 200 Gb/s; each pool is on one kind (the planner tries both ways round).
    "A+C": Testbed("A+C", L40S, 32, 200.0, gpu2=H20, count2=16,
                   description="32 x L40S 48 GB + 16 x H20 96 GB, 200 Gb/s"),
}


@dataclass(frozen=True)
class ModelPreset:
    """A flow-matching transformer. ``joint_text``: text tokens share the self-attention sequence (MM-DiT);
    otherwise text enters by cross-attention. ``forwards_per_step``: 2 with true CFG (cond + uncond), 1 for
    guidance-distilled models."""

    name: str
    params_b: float
    layers: int
    hidden: int
    text_tokens: int
    joint_text: bool
    forwards_per_step: int
    video: bool
    spatial_down: int = 8          # VAE spatial compression
    temporal_down: int = 1         # VAE temporal compression (video: 4, first frame kept)
    patch: int = 2                 # spatial patchify of latents
    latent_channels: int = 16
    vae_gflop_per_mpx: float = 7000.0   # decoder FLOPs per output megapixel (per frame for video)
    reward_tflop: float = 0.5           # reward model FLOPs per sample (TFLOP)
    text_dim: int = 4096                # width of the cached prompt embeddings shipped with a trajectory
    source: str = ""


# VAE decoder cost: an SD-style 2D decoder (4 up-blocks, 128-512 channels, 3x3 convs) costs ~0.9 TMAC, i.e.
# ~1.8 TFLOP per 512x512 output (0.262 Mpx), i.e. ~6900 GFLOP per output megapixel.
# Causal 3D VAEs use 3x3x3 kernels (~3x per pixel-frame); the Wan report says Wan-VAE decodes ~2.5x faster
# than HunyuanVideo's VAE at the same resolution, so we take 3x (HunyuanVideo) and 1.2x (Wan) of the 2D cost.
# Rewards: images scored by a CLIP ViT-H/14 reward (PickScore / HPS-v2 class, ~1B params x 257 tokens x 2
# = ~0.5 TFLOP); videos by a ~2B VLM reward (VideoAlign class) over sampled frames, ~2 x 2e9 x 2000 tokens
# = ~8 TFLOP.
MODELS: dict[str, ModelPreset] = {
    # FLUX.1-dev model card: "12 billion parameter rectified flow transformer"; flux reference config:
    # 19 double + 38 single blocks, hidden 3072; T5 prompt up to 512 tokens; guidance-distilled (1 forward).
    "flux": ModelPreset("FLUX.1-dev", 12.0, 57, 3072, 512, True, 1, False,
                        vae_gflop_per_mpx=6900.0, reward_tflop=0.5,
                        source="black-forest-labs/FLUX.1-dev model card; flux util.py configs"),
    # Wan2.1-T2V-14B model card: 14B, dim 5120, 40 layers, 40 heads, FFN 13824; umT5 text (512 tokens) by
    # cross-attention; Wan-VAE 4x8x8 compression, 16 channels, patch (1, 2, 2); sampled with CFG (2 fwd).
    "wan": ModelPreset("Wan2.1-T2V-14B", 14.0, 40, 5120, 512, False, 2, True, temporal_down=4,
                       vae_gflop_per_mpx=6900.0 * 1.2, reward_tflop=8.0,
                       source="Wan-AI/Wan2.1-T2V-14B model card and config.json"),
    # HunyuanVideo model card: 13B parameters; 20 dual-stream + 40 single-stream blocks, hidden 3072;
    # causal 3D VAE 4x8x8, 16 channels, patch (1, 2, 2); LLM text features (256 tokens, joint attention);
    # guidance-distilled ("embedded guidance"), 1 forward per step.
    "hunyuan": ModelPreset("HunyuanVideo-13B", 13.0, 60, 3072, 256, True, 1, True, temporal_down=4,
                           vae_gflop_per_mpx=6900.0 * 3.0, reward_tflop=8.0,
                           source="tencent/HunyuanVideo model card and paper (Table: 13B config)"),
    # Qwen-Image model card: 20B MMDiT, 60 layers, hidden 3072; VAE 8x spatial, 16 channels (Wan-2.1 VAE
    # based), patch 2; Qwen2.5-VL text features (joint attention, ~256 tokens); true CFG (2 forwards).
    "qwen-image": ModelPreset("Qwen-Image-20B", 20.0, 60, 3072, 256, True, 2, False,
                              vae_gflop_per_mpx=6900.0, reward_tflop=0.5, text_dim=3584,
                              source="Qwen/Qwen-Image model card and technical report"),
}


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

    @property
    def trained_timesteps(self) -> int:
        """S = int(T * fraction), at least 1 (as Flow-GRPO computes it)."""
        return max(1, int(self.sampling_steps * self.timestep_fraction + 1e-9))


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
