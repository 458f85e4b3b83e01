"""Tiny random diffusers models saved in the standard directory layout (no downloads)."""

from __future__ import annotations

from pathlib import Path

import torch

WORDS = ["<pad>", "</s>", "<unk>", "a", "cat", "dog", "photo", "of", "the", "red", "blue", "green", "small", "big"]


def word_tokenizer(max_length: int):
    """A word-level fast tokenizer built in memory (stands in for CLIP / T5 tokenizers)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tk.normalizer = normalizers.Lowercase()
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", eos_token="</s>", unk_token="<unk>", model_max_length=max_length
    )


def tiny_vae_2d(latent_channels: int, scaling: float = 1.5, shift: float | None = 0.1):
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), block_out_channels=(8, 8), layers_per_block=1,
        latent_channels=latent_channels, norm_num_groups=4, sample_size=16, scaling_factor=scaling,
        shift_factor=shift, mid_block_add_attention=False,
    )  # fmt: skip


def save_sd3(root: Path, seed: int = 0) -> Path:
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    torch.manual_seed(seed)
    tr = SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=16, caption_projection_dim=16, pooled_projection_dim=8, out_channels=4,
        pos_embed_max_size=16,
    )  # fmt: skip
    pipe = StableDiffusion3Pipeline(
        transformer=tr, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=tiny_vae_2d(4),
        text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None, text_encoder_3=None, tokenizer_3=None,
    )  # fmt: skip
    pipe.save_pretrained(str(root))
    return root


SD3_COND = {"prompt_embeds": (9, 16), "pooled_prompt_embeds": (8,)}


def random_cache(cache_dir: Path, encoder_id: str, texts, shapes: dict, seed: int = 0, masks: dict | None = None):
    """A precomputed prompt cache of random embeddings (stand-in for running the text encoders)."""
    from digenrl.models.prompt_cache import PromptCache

    g = torch.Generator().manual_seed(seed)
    cache = PromptCache(cache_dir, encoder_id)
    cond = {k: torch.randn(len(texts), *s, generator=g) for k, s in shapes.items()}
    for k, length in (masks or {}).items():
        m = torch.zeros(len(texts), shapes["prompt_embeds"][0], dtype=torch.long)
        for i in range(len(texts)):
            m[i, : max(1, length - i % length)] = 1
        cond["prompt_embeds"] = cond["prompt_embeds"] * m[..., None]
        cond[k] = m
    cache.put(list(texts), cond)
    return cache


def save_flux(root: Path, seed: int = 0, guidance_embeds: bool = True) -> Path:
    """Tiny FLUX with real (tiny, random) CLIP and T5 text encoders and word-level tokenizers."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    torch.manual_seed(seed)
    clip = CLIPTextModel(CLIPTextConfig(
        vocab_size=len(WORDS), hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        max_position_embeddings=16, projection_dim=8, bos_token_id=0, eos_token_id=1, pad_token_id=0,
    ))  # fmt: skip
    t5 = T5EncoderModel(T5Config(vocab_size=len(WORDS), d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2))
    tr = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=16, pooled_projection_dim=8, guidance_embeds=guidance_embeds, axes_dims_rope=(2, 2, 4),
    )  # fmt: skip
    sched = FlowMatchEulerDiscreteScheduler(
        shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=4, max_image_seq_len=64
    )
    pipe = FluxPipeline(
        transformer=tr, scheduler=sched, vae=tiny_vae_2d(4), text_encoder=clip, tokenizer=word_tokenizer(16),
        text_encoder_2=t5, tokenizer_2=word_tokenizer(32),
    )  # fmt: skip
    pipe.save_pretrained(str(root))
    return root


def save_wan(root: Path, seed: int = 0) -> Path:
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel

    torch.manual_seed(seed)
    tr = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
        text_dim=16, freq_dim=16, ffn_dim=16, num_layers=1, rope_max_seq_len=32,
    )  # fmt: skip
    vae = AutoencoderKLWan(
        base_dim=4, z_dim=4, dim_mult=[1, 1], num_res_blocks=1, temperal_downsample=[True],
        latents_mean=[0.1, -0.2, 0.3, 0.0], latents_std=[1.5, 0.5, 2.0, 1.0], scale_factor_temporal=2,
        scale_factor_spatial=2,
    )  # fmt: skip
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
                       transformer=tr)  # fmt: skip
    pipe.save_pretrained(str(root))
    return root


def save_qwen_image(root: Path, seed: int = 0) -> Path:
    from diffusers import (AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline,
                           QwenImageTransformer2DModel)  # fmt: skip

    torch.manual_seed(seed)
    tr = QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=16, axes_dims_rope=(2, 2, 4),
    )  # fmt: skip
    vae = AutoencoderKLQwenImage(
        base_dim=4, z_dim=4, dim_mult=[1, 1], num_res_blocks=1, temperal_downsample=[False],
        latents_mean=[0.1, -0.2, 0.3, 0.0], latents_std=[1.5, 0.5, 2.0, 1.0],
    )  # fmt: skip
    sched = FlowMatchEulerDiscreteScheduler(
        shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9, base_image_seq_len=4,
        max_image_seq_len=64, shift_terminal=0.02,
    )  # fmt: skip
    pipe = QwenImagePipeline(scheduler=sched, vae=vae, text_encoder=None, tokenizer=None, transformer=tr)
    pipe.save_pretrained(str(root))
    return root


def save_hunyuan_video(root: Path, seed: int = 0) -> Path:
    from diffusers import (AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler, HunyuanVideoPipeline,
                           HunyuanVideoTransformer3DModel)  # fmt: skip

    torch.manual_seed(seed)
    tr = HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=1, num_single_layers=1,
        num_refiner_layers=1, patch_size=1, patch_size_t=1, text_embed_dim=16, pooled_projection_dim=8,
        rope_axes_dim=(2, 2, 4),
    )  # fmt: skip
    vae = AutoencoderKLHunyuanVideo(
        latent_channels=4, down_block_types=("HunyuanVideoDownBlock3D",) * 3,
        up_block_types=("HunyuanVideoUpBlock3D",) * 3, block_out_channels=(4, 4, 4), layers_per_block=1,
        norm_num_groups=4, spatial_compression_ratio=2, temporal_compression_ratio=4, mid_block_add_attention=False,
    )  # fmt: skip
    pipe = HunyuanVideoPipeline(text_encoder=None, tokenizer=None, transformer=tr, vae=vae,
                                scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), text_encoder_2=None,
                                tokenizer_2=None)  # fmt: skip
    pipe.save_pretrained(str(root))
    return root


def save_tiny_clip(path, tokenizer, vocab_size: int):
    """A tiny random CLIP (8-wide, 16 px images) with ``tokenizer``, saved as a local model directory at ``path``
    (what the CLIP-based rewards load). Seeded: the same call gives the same weights."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTextConfig, CLIPVisionConfig

    torch.manual_seed(0)
    text = CLIPTextConfig(vocab_size=vocab_size, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                          num_attention_heads=2, max_position_embeddings=16, bos_token_id=0, eos_token_id=1,
                          pad_token_id=0)  # fmt: skip
    vision = CLIPVisionConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                              image_size=16, patch_size=4)  # fmt: skip
    CLIPModel(CLIPConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=8)).save_pretrained(path)
    ip = CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    CLIPProcessor(image_processor=ip, tokenizer=tokenizer).save_pretrained(path)
    return path
