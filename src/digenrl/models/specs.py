"""The one registry of model facts: per family, its published transformer config and what the adapters, the memory
plan (``train.memory``) and the simulator (``sim.presets``, ``sim.roofline``) need to know about it. Torch-free.

One spelling per family, the config's ``model.kind``: ``sd3``, ``flux``, ``wan``, ``qwen_image``, ``hunyuan_video``
(and ``tiny_dit``, the built-in demo, which has no published config: ``spec`` refuses it). The simulator's former
spellings are accepted as documented aliases where a user could have typed them (``digenrl simulate --model``):
``hunyuan``, ``qwen-image``, ``sd35-medium`` (``canonical``).

Per family (``ModelSpec``, each field commented): the published ``transformer/config.json`` (cited per entry; the
memory probe builds the class from it, ``models.memory_probe``, and ``tests/sim/test_sim_flops.py`` checks the
closed forms of ``models.flops`` against it) and the facts the adapters, the memory plan and the simulator read:
text, guidance, latent geometry, default sample size, frozen parts' sizes and VAE FLOPs.

Latent tokens of one sample (``latent_tokens``)::

    T_i = (H / (8 p)) (W / (8 p)) [((F - 1) / 4 + 1) for video]        (p = 2, VAE 8 x 8 (x 4 in time))
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

ALIASES = {"hunyuan": "hunyuan_video", "qwen-image": "qwen_image", "sd35-medium": "sd3"}


@dataclass(frozen=True)
class ModelSpec:
    kind: str
    name: str
    diffusers_class: str
    config: dict[str, Any]        # transformer/config.json: the class's constructor arguments
    source: str                   # the repository whose config.json this is
    layer_keys: dict[str, str]    # config layer-count key -> the block list it sizes (the memory probe's)
    max_sequence_length: int      # the adapter's default text length (model.options.max_sequence_length)
    joint_text: bool              # text tokens share the self-attention sequence (else cross-attention)
    guidance_distilled: bool      # one forward per denoising step (else 2 with CFG)
    text_dim: int                 # width of the prompt embeddings (the prompt cache, a trajectory's condition)
    text_encoder_params: float    # the model card's text encoders
    vae_params: float
    vae_flop_per_px: float        # VAE decoder FLOPs per output pixel (per pixel-frame for video)
    default_size: tuple[int, int, int]  # the adapter's default (height, width, frames)
    text_prefix: int = 0          # tokens ahead of the long encoder's (SD3: 77 CLIP)
    video: bool = False
    latent_channels: int = 16
    spatial_down: int = 8
    temporal_down: int = 1
    patch: int = 2                # spatial token size in latent pixels
    sequence_parallel: str = ""   # whose plan splits its sequence (docs/sequence_parallel.md); "" none
    pipeline_class: str = ""      # the diffusers pipeline of its model directories (model_index.json)
    text_components: tuple[str, ...] = ()  # its text encoders and tokenizers (model_index.json)
    extra_components: tuple[str, ...] = ()  # optional pipeline components never used (image encoders...)

    @property
    def heads(self) -> int:
        return int(self.config["num_attention_heads"])

    @property
    def head_dim(self) -> int:
        return int(self.config["attention_head_dim"])

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim

    @property
    def forwards_per_step(self) -> int:
        """Transformer forwards per denoising step: 1 for a guidance-distilled model, 2 with CFG."""
        return 1 if self.guidance_distilled else 2

    def text_tokens(self, max_sequence_length: int | None = None) -> int:
        """Text tokens of one forward: the prefix plus ``max_sequence_length`` (default: the adapter's)."""
        return self.text_prefix + (self.max_sequence_length if max_sequence_length is None else int(max_sequence_length))

    def latent_frames(self, frames: int) -> int:
        return (frames - 1) // self.temporal_down + 1 if self.video else 1

    def latent_tokens(self, height: int, width: int, frames: int = 1) -> int:
        """Latent tokens of one sample (module docstring)."""
        per = self.spatial_down * self.patch
        return (height // per) * (width // per) * self.latent_frames(frames)

    def latent_elements(self, height: int, width: int, frames: int = 1) -> int:
        """Elements of one sample's latent (channels x latent frames x latent height x latent width)."""
        return (self.latent_channels * self.latent_frames(frames) * (height // self.spatial_down)
                * (width // self.spatial_down))

    def default_options(self) -> tuple[tuple[str, Any], ...]:
        """The adapter's default ``model.options``: sample size (and frames for video) and text length."""
        h, w, f = self.default_size
        return (("height", h), ("width", w)) + ((("frames", f),) if self.video else ()) + (
            ("max_sequence_length", self.max_sequence_length),)

    @cached_property
    def arch(self):
        """The closed forms of its parameters and FLOPs (``models.flops.Arch``)."""
        from .flops import arch_of

        return arch_of(self)


# black-forest-labs/FLUX.1-dev transformer/config.json; T5 prompts of up to 512 tokens (diffusers' default
# max_sequence_length); guidance-distilled; VAE decoder FLOPs counted with torch.utils.flop_counter on diffusers'
# AutoencoderKL (16 channels): 2.515 TFLOP per 512 x 512 image. Text encoders: CLIP-L 123M + T5-XXL encoder 4.76B.
FLUX = ModelSpec(
    "flux", "FLUX.1-dev", "FluxTransformer2DModel",
    dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
         num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
         axes_dims_rope=(16, 56, 56)),
    "huggingface.co/black-forest-labs/FLUX.1-dev transformer/config.json",
    {"num_layers": "transformer_blocks", "num_single_layers": "single_transformer_blocks"},
    max_sequence_length=512, joint_text=True, guidance_distilled=True, text_dim=4096, text_encoder_params=4.88e9,
    vae_params=83.7e6, vae_flop_per_px=9.59e6, default_size=(512, 512, 1),
    pipeline_class="FluxPipeline",
    text_components=("text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2"),
    extra_components=("image_encoder", "feature_extractor"))

# stabilityai/stable-diffusion-3.5-medium transformer/config.json (MMDiT-X: dual attention in layers 0-12); two
# CLIP hidden states (77 tokens) then T5 (max_sequence_length, pipeline default 256); true CFG; the SD3 VAE (the
# FLUX one's FLOPs per pixel). Text encoders: CLIP-L + CLIP-G 0.82B + T5-XXL.
SD3 = ModelSpec(
    "sd3", "SD3.5-Medium", "SD3Transformer2DModel",
    dict(sample_size=128, patch_size=2, in_channels=16, num_layers=24, attention_head_dim=64, num_attention_heads=24,
         joint_attention_dim=4096, caption_projection_dim=1536, pooled_projection_dim=2048, out_channels=16,
         pos_embed_max_size=384, dual_attention_layers=tuple(range(13)), qk_norm="rms_norm"),
    "huggingface.co/stabilityai/stable-diffusion-3.5-medium transformer/config.json",
    {"num_layers": "transformer_blocks"},
    max_sequence_length=256, text_prefix=77, joint_text=True, guidance_distilled=False, text_dim=4096,
    text_encoder_params=5.58e9, vae_params=83.7e6, vae_flop_per_px=9.59e6, default_size=(512, 512, 1),
    pipeline_class="StableDiffusion3Pipeline",
    text_components=("text_encoder", "text_encoder_2", "text_encoder_3", "tokenizer", "tokenizer_2", "tokenizer_3"),
    extra_components=("image_encoder", "feature_extractor"))

# Wan-AI/Wan2.1-T2V-14B-Diffusers transformer/config.json; umT5 text (512 tokens) by cross-attention; Wan-VAE 4 x 8
# x 8, patch (1, 2, 2); true CFG. VAE: AutoencoderKLWan 112.75 TFLOP for 33 x 480 x 832 = 8.56 MFLOP per
# pixel-frame (counted as FLUX's). Text encoder: umT5-XXL encoder 5.7B.
WAN = ModelSpec(
    "wan", "Wan2.1-T2V-14B", "WanTransformer3DModel",
    dict(patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128, in_channels=16, out_channels=16,
         text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40, cross_attn_norm=True,
         qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None, added_kv_proj_dim=None, rope_max_seq_len=1024),
    "huggingface.co/Wan-AI/Wan2.1-T2V-14B-Diffusers transformer/config.json",
    {"num_layers": "blocks"},
    max_sequence_length=512, joint_text=False, guidance_distilled=False, text_dim=4096, text_encoder_params=5.7e9,
    vae_params=127e6, vae_flop_per_px=8.56e6, default_size=(240, 416, 33), video=True, temporal_down=4,
    sequence_parallel="diffusers' _cp_plan",
    pipeline_class="WanPipeline", text_components=("text_encoder", "tokenizer"), extra_components=("transformer_2",))

# Qwen/Qwen-Image transformer/config.json; Qwen2.5-VL-7B text features (8.3B) in the joint attention, zero-padded
# to max_sequence_length (the adapter's default 512); the Wan-2.1 VAE (10.85 MFLOP per pixel for one 512 x 512
# frame); true CFG.
QWEN_IMAGE = ModelSpec(
    "qwen_image", "Qwen-Image-20B", "QwenImageTransformer2DModel",
    dict(patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
         num_attention_heads=24, joint_attention_dim=3584, guidance_embeds=False, axes_dims_rope=(16, 56, 56)),
    "huggingface.co/Qwen/Qwen-Image transformer/config.json",
    {"num_layers": "transformer_blocks"},
    max_sequence_length=512, joint_text=True, guidance_distilled=False, text_dim=3584, text_encoder_params=8.3e9,
    vae_params=127e6, vae_flop_per_px=10.85e6, default_size=(512, 512, 1),
    pipeline_class="QwenImagePipeline",
    text_components=("text_encoder", "tokenizer"))

# hunyuanvideo-community/HunyuanVideo transformer/config.json (tencent/HunyuanVideo); LLM text features (256
# tokens) in the joint attention; causal 3D VAE 4 x 8 x 8, patch (1, 2, 2); guidance-distilled ("embedded
# guidance"). VAE: AutoencoderKLHunyuanVideo 237.3 TFLOP for 33 x 480 x 848 = 17.67 MFLOP per pixel-frame
# (untiled). Text encoders: LLaVA-Llama-3-8B 8.0B + CLIP-L.
HUNYUAN_VIDEO = ModelSpec(
    "hunyuan_video", "HunyuanVideo-13B", "HunyuanVideoTransformer3DModel",
    dict(in_channels=16, out_channels=16, num_attention_heads=24, attention_head_dim=128, num_layers=20,
         num_single_layers=40, num_refiner_layers=2, mlp_ratio=4.0, patch_size=2, patch_size_t=1,
         qk_norm="rms_norm", guidance_embeds=True, text_embed_dim=4096, pooled_projection_dim=768,
         rope_theta=256.0, rope_axes_dim=(16, 56, 56)),
    "huggingface.co/hunyuanvideo-community/HunyuanVideo transformer/config.json",
    {"num_layers": "transformer_blocks", "num_single_layers": "single_transformer_blocks",
     "num_refiner_layers": "context_embedder.token_refiner.refiner_blocks"},
    max_sequence_length=256, joint_text=True, guidance_distilled=True, text_dim=4096, text_encoder_params=8.1e9,
    vae_params=246e6, vae_flop_per_px=17.67e6, default_size=(480, 480, 53), video=True, temporal_down=4,
    sequence_parallel="digenrl's plan (models.hunyuan_video_sp)", pipeline_class="HunyuanVideoPipeline",
    text_components=("text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2"))

SPECS: dict[str, ModelSpec] = {s.kind: s for s in (SD3, FLUX, WAN, QWEN_IMAGE, HUNYUAN_VIDEO)}
# Families whose transformer can split a sample's sequence over ranks: diffusers' own context-parallel plan
# (``_cp_plan``) or the project's (HunyuanVideo has none in diffusers 0.42).
SEQUENCE_PARALLEL_FAMILIES = {k: s.sequence_parallel for k, s in SPECS.items() if s.sequence_parallel}


def canonical(name: str) -> str:
    """The family's one spelling (``model.kind``) of ``name``, which may be a documented alias (module doc)."""
    return ALIASES.get(name, name)


def spec(name: str) -> ModelSpec:
    """The spec of ``name`` (a ``model.kind`` or an alias); ``KeyError`` naming the known kinds otherwise."""
    try:
        return SPECS[canonical(name)]
    except KeyError:
        raise KeyError(f"no model spec for {name!r} (known: {', '.join(SPECS)}; aliases: "
                       f"{', '.join(f'{a} = {k}' for a, k in ALIASES.items())})") from None


__all__ = ["ALIASES", "ModelSpec", "SEQUENCE_PARALLEL_FAMILIES", "SPECS", "canonical", "spec"]
