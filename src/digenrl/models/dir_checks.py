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

from digenrl.models.specs import SPECS


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # missing or broken files are reported by the layout checks
    return data if isinstance(data, dict) else {}


def check_family(path: str, kind: str) -> None:
    """``ValueError`` naming ``model.kind`` when the directory's classes (the registry's ``pipeline_class`` and
    ``diffusers_class``) belong to another family."""
    if kind not in SPECS:
        return
    root = Path(path).expanduser()
    pipeline = str(_json(root / "model_index.json").get("_class_name", ""))
    transformer = str(_json(root / "transformer" / "config.json").get("_class_name", ""))
    pipe, want = SPECS[kind].pipeline_class, SPECS[kind].diffusers_class
    if transformer == want or (not transformer and pipeline == pipe):
        return  # (another pipeline class over the family's transformer, e.g. a variant, loads too)
    holds = next((k for k, s in SPECS.items() if transformer == s.diffusers_class or pipeline == s.pipeline_class),
                 None)
    what = " with ".join(c for c in (pipeline, transformer) if c) or "no class names"
    fix = f"set model.kind={holds}" if holds else f"point model.path at a {want} directory"
    raise ValueError(f"model.kind: {kind} needs a {pipe} directory ({want}), but model.path {str(root)!r} holds "
                     f"{what}; {fix}")


def check_resolution(path: str, kind: str, options: dict, default_size: int = 512) -> None:
    """``ValueError`` naming ``model.options.height`` / ``width`` when the transformer cannot take that size."""
    if kind != "sd3":
        return
    root = Path(path).expanduser()
    tr = _json(root / "transformer" / "config.json")
    blocks = _json(root / "vae" / "config.json").get("block_out_channels")
    f = 2 ** (len(blocks) - 1) if isinstance(blocks, list) and blocks else None
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
