"""What a diffusers directory says about itself, checked against the config before anything is loaded.

* ``check_family``: ``model_index.json``'s pipeline class and ``transformer/config.json``'s class must be
  ``model.kind``'s (a FLUX kind on an SD3 directory would otherwise die in the adapter with
  ``AttributeError: ... 'guidance_embeds'``); the error names the kind the directory holds.
* ``check_resolution``: ``model.options.height`` / ``width`` against the transformer's positional limits. SD3's
  learned position table covers ``pos_embed_max_size`` patches per side, so a sample of H pixels needs
  ``H / (f p) <= pos_embed_max_size`` (f the VAE's spatial factor ``2 ** (len(block_out_channels) - 1)``, p the
  patch size), and H must be a multiple of ``f p``. (FLUX, Qwen-Image and HunyuanVideo compute their rotary
  positions for any size; Wan2.1's rotary table has ``rope_max_seq_len`` (1024) positions per axis, far above
  any trainable video.)

JSON files only: nothing is imported from diffusers or loaded.
"""

from __future__ import annotations

import json
from pathlib import Path

# kind -> (pipeline classes, transformer class) of the family's diffusers directories
FAMILY_CLASSES: dict[str, tuple[tuple[str, ...], str]] = {
    "sd3": (("StableDiffusion3Pipeline",), "SD3Transformer2DModel"),
    "flux": (("FluxPipeline",), "FluxTransformer2DModel"),
    "wan": (("WanPipeline",), "WanTransformer3DModel"),
    "qwen_image": (("QwenImagePipeline",), "QwenImageTransformer2DModel"),
    "hunyuan_video": (("HunyuanVideoPipeline",), "HunyuanVideoTransformer3DModel"),
}


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # missing or broken files are reported by the layout checks
    return data if isinstance(data, dict) else {}


def _kind_of(pipeline: str, transformer: str) -> str | None:
    for kind, (pipes, tr) in FAMILY_CLASSES.items():
        if transformer == tr or pipeline in pipes:
            return kind
    return None


def check_family(path: str, kind: str) -> None:
    """``ValueError`` naming ``model.kind`` when the directory's classes belong to another family."""
    if kind not in FAMILY_CLASSES:
        return
    root = Path(path).expanduser()
    pipeline = str(_json(root / "model_index.json").get("_class_name", ""))
    transformer = str(_json(root / "transformer" / "config.json").get("_class_name", ""))
    pipes, want = FAMILY_CLASSES[kind]
    if transformer == want or (not transformer and pipeline in pipes):
        return  # (another pipeline class over the family's transformer, e.g. a variant, loads too)
    holds = _kind_of(pipeline, transformer)
    what = " with ".join(c for c in (pipeline, transformer) if c) or "no class names"
    fix = f"set model.kind={holds}" if holds else f"point model.path at a {want} directory"
    raise ValueError(f"model.kind: {kind} needs a {pipes[0]} directory ({want}), but model.path {str(root)!r} holds "
                     f"{what}; {fix}")


def vae_spatial_factor(vae_config: dict) -> int | None:
    blocks = vae_config.get("block_out_channels")
    return 2 ** (len(blocks) - 1) if isinstance(blocks, list) and blocks else None


def check_resolution(path: str, kind: str, options: dict, default_size: int = 512) -> None:
    """``ValueError`` naming ``model.options.height`` / ``width`` when the transformer cannot take that size."""
    if kind != "sd3":
        return
    root = Path(path).expanduser()
    tr = _json(root / "transformer" / "config.json")
    f = vae_spatial_factor(_json(root / "vae" / "config.json"))
    p, limit = tr.get("patch_size"), tr.get("pos_embed_max_size")
    if not isinstance(f, int) or not isinstance(p, int):
        return
    for key in ("height", "width"):
        size = options.get(key, default_size)
        if not isinstance(size, int):
            continue
        if size % (f * p):
            raise ValueError(f"model.options.{key}: {size} is not a multiple of {f * p} (VAE factor {f} x patch size "
                             f"{p} of {str(root)!r}); use e.g. {max(f * p, size - size % (f * p))}")
        if isinstance(limit, int) and size // (f * p) > limit:
            raise ValueError(f"model.options.{key}: {size} px is {size // (f * p)} patches, over this SD3 "
                             f"transformer's pos_embed_max_size {limit} ({str(root)!r}); use at most "
                             f"{limit * f * p} px")
