"""FLUX.1-architecture models with random weights for the GPU benchmarks (nothing is downloaded).

Shared by ``gpu_throughput.py``, ``gpu_memory.py`` and ``gpu_calibrate.py``:

* ``flux_transformer``: ``FluxTransformer2DModel`` at the FLUX.1-dev widths (``models.specs``:
  3072 hidden = 24 heads x 128, T5 width 4096, CLIP pooled 768, 64 packed latent channels, guidance
  embedding) with a chosen number of double-stream and single-stream blocks; ``tiny=True`` gives a 64-wide
  model (4 heads x 16) for CPU smoke runs.
* ``flux_vae``: the FLUX VAE architecture (4 levels 128-512 channels, 16 latent channels, no quant convs;
  scaling/shift factors of FLUX.1-dev), or a 2-level 8-channel one with ``tiny=True``.
* ``flux_policy``: a ``FluxPolicy`` over both, with random text embeddings in its prompt cache (no text
  encoders), built from a ``ModelConfig`` (dtype, device, LoRA, height/width, max_sequence_length).
* ``save_pipeline``: such modules saved as a diffusers FLUX pipeline folder (no text encoders) with a prompt cache
  of random rows and a prompt file, for runs that load the model from ``model.path`` (``fast_pool_cpu.py``,
  ``gpu_step.py``).
* ``sync`` / ``timed`` / ``median_time``: wall-clock timing around device synchronisation.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from pathlib import Path
from typing import Sequence

import torch

# 64 hidden (4 heads x 16), rotary axes summing to the head dim; text widths 32 (T5 stand-in) and 16 (pooled).
TINY_TRANSFORMER = dict(in_channels=16, attention_head_dim=16, num_attention_heads=4, joint_attention_dim=32,
                        pooled_projection_dim=16, guidance_embeds=True, axes_dims_rope=(4, 6, 6))  # fmt: skip
FLUX_VAE_FACTORS = dict(scaling_factor=0.3611, shift_factor=0.1159)  # FLUX.1-dev vae/config.json


def flux_transformer(double: int, single: int, *, tiny: bool = False, device="cpu", **override):
    """Random-weight FLUX transformer with ``double`` + ``single`` blocks (float32, built on ``device``)."""
    from diffusers import FluxTransformer2DModel

    from digenrl.models.specs import SPECS

    kw = dict(TINY_TRANSFORMER) if tiny else dict(SPECS["flux"].config)
    kw.update(override, num_layers=double, num_single_layers=single)
    with torch.device(device):
        return FluxTransformer2DModel(**kw)


def flux_vae(*, tiny: bool = False, device="cpu"):
    from diffusers import AutoencoderKL

    if tiny:
        kw = dict(down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                  block_out_channels=(8, 8), latent_channels=4, norm_num_groups=4)
    else:
        kw = dict(down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                  block_out_channels=(128, 256, 512, 512), layers_per_block=2, latent_channels=16,
                  use_quant_conv=False, use_post_quant_conv=False)
    with torch.device(device):
        return AutoencoderKL(**kw, **FLUX_VAE_FACTORS)


def text_widths(tiny: bool) -> tuple[int, int]:
    """(T5 width, pooled CLIP width) of the prompt embeddings the transformer takes."""
    return (TINY_TRANSFORMER["joint_attention_dim"], TINY_TRANSFORMER["pooled_projection_dim"]) if tiny else (4096, 768)


def flux_policy(model_cfg, *, double: int, single: int, tiny: bool, prompts: Sequence[str], seed: int = 0):
    """A ``FluxPolicy`` (``model_cfg``: dtype, device, lora, options) over random-weight FLUX modules; every text
    of ``prompts`` and the negative prompt get random T5 rows (``max_sequence_length`` tokens) and pooled rows in
    the prompt cache."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    from digenrl.models.diffusers_files import DTYPES
    from digenrl.models.diffusers_flux import FluxPolicy

    dtype, device = DTYPES[model_cfg.dtype], torch.device(model_cfg.device)
    torch.manual_seed(seed)
    tr = flux_transformer(double, single, tiny=tiny, device=device).to(dtype)
    vae = flux_vae(tiny=tiny, device=device)
    # FLUX.1-dev scheduler/scheduler_config.json
    sched = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15)
    pipe = FluxPipeline(transformer=tr, scheduler=sched, vae=vae, text_encoder=None, tokenizer=None,
                        text_encoder_2=None, tokenizer_2=None)  # fmt: skip
    policy = FluxPolicy(pipe, model_cfg, encoder_id="benchmark-random")
    texts = list(dict.fromkeys(list(prompts) + [policy.negative_prompt]))
    t5, pooled = text_widths(tiny)
    tokens = int(policy.options["max_sequence_length"])
    g = torch.Generator().manual_seed(seed + 1)
    policy.prompt_cache.put(texts, {
        "prompt_embeds": torch.randn(len(texts), tokens, t5, generator=g).to(dtype),
        "pooled_prompt_embeds": torch.randn(len(texts), pooled, generator=g).to(dtype),
    })  # fmt: skip
    return policy


@contextlib.contextmanager
def quiet_diffusers():
    """diffusers' warnings off (saving a pipeline without text encoders names every absent one)."""
    from diffusers.utils import logging as dlog

    level = dlog.get_verbosity()
    dlog.set_verbosity_error()
    try:
        yield
    finally:
        dlog.set_verbosity(level)


def save_pipeline(root: Path, transformer, vae, prompts: Sequence[str], tokens: int) -> list[str]:
    """``transformer`` and ``vae`` as a FLUX pipeline (FLUX.1-dev's scheduler, no text encoders) under
    ``root/flux``, a prompt cache of random T5 rows (``tokens`` each) and pooled rows for ``prompts`` and the
    negative prompt under ``root/cache``, and ``prompts`` in ``root/prompts.txt``; returns the config overrides
    that point at them. The caller seeds the modules; the cache rows come from a generator seeded with 1."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    from digenrl.models.prompt_cache import PromptCache

    sched = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15)
    pipe = FluxPipeline(transformer=transformer, scheduler=sched, vae=vae, text_encoder=None, tokenizer=None,
                        text_encoder_2=None, tokenizer_2=None)
    with quiet_diffusers():
        pipe.save_pretrained(str(root / "flux"))
    texts = list(prompts) + [""]  # and the negative prompt
    g = torch.Generator().manual_seed(1)
    PromptCache(root / "cache", "flux-random").put(texts, {
        "prompt_embeds": torch.randn(len(texts), tokens, transformer.config.joint_attention_dim, generator=g),
        "pooled_prompt_embeds": torch.randn(len(texts), transformer.config.pooled_projection_dim, generator=g)})
    (root / "prompts.txt").write_text("\n".join(prompts) + "\n")
    return [f"model.path={root / 'flux'}", f"model.prompt_cache_dir={root / 'cache'}",
            f"task.prompts_file={root / 'prompts.txt'}"]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, repeats: int):
    """(mean seconds of ``repeats`` calls after one warm-up call, the last call's result)."""
    fn()  # warm-up (kernels, allocator)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        out = fn()
    sync(device)
    return (time.perf_counter() - t0) / repeats, out


def median_time(fn, device: torch.device, repeats: int) -> float:
    """Median seconds of ``repeats`` calls after one warm-up call, each call synchronised."""
    fn()
    ts = []
    for _ in range(max(1, repeats)):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)
