"""What a diffusers directory says about itself, checked against the config before anything is loaded.

* ``check_family``: ``model_index.json``'s pipeline class and ``transformer/config.json``'s class must be
  ``model.kind``'s (a FLUX kind on an SD3 directory would otherwise die in the adapter with
  ``AttributeError: ... 'guidance_embeds'``); the error names the kind the directory holds.
* ``check_resolution``: ``model.options.height`` / ``width`` / ``frames`` against the directory's latent grid
  (``latent_grid``, read as each family's diffusers pipeline derives it; ``check_sample_size`` is the rule, the
  one the policies apply to their loaded modules) and the transformer's positional limits. SD3's learned
  position table covers ``pos_embed_max_size`` patches per side, so a sample of H pixels needs
  ``H / (f p) <= pos_embed_max_size``. (FLUX, Qwen-Image and HunyuanVideo compute their rotary positions for any
  size; Wan2.1's rotary table has ``rope_max_seq_len`` (1024) positions per axis, far above any trainable video.)
* ``check_sequence_split``: a sequence-parallel degree must divide the transformer's heads and a sample's latent
  tokens (``LatentGrid.tokens``), the rule ``models.sequence_parallel.check_degree`` applies to a built policy.

JSON files only: nothing is imported from diffusers or loaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
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


@dataclass(frozen=True)
class LatentGrid:
    """How a family's sample size maps onto its latent tokens: one token covers ``spatial * patch_h`` by
    ``spatial * patch_w`` pixels (FLUX / Qwen-Image: their 2 x 2 latent packing is the patch), and a video has a
    latent frame for its first frame and one per ``temporal`` frames after it."""

    spatial: int
    patch_h: int
    patch_w: int
    temporal: int | None = None  # a video family's VAE time factor
    patch_t: int = 1  # latent frames per token (a video transformer's temporal patch)

    def tokens(self, height: int, width: int, frames: int = 1) -> int:
        """Latent tokens of one sample after the patch embedding: ((F - 1) / f_t + 1) / p_t x H / (f p_h) x
        W / (f p_w) (one latent frame for an image)."""
        latent_frames = 1 if self.temporal is None else (frames - 1) // self.temporal + 1
        return (latent_frames // self.patch_t) * (height // (self.spatial * self.patch_h)) * (
            width // (self.spatial * self.patch_w))


def check_sample_size(kind: str, options: dict, grid: LatentGrid) -> tuple[int, int, int]:
    """(height, width, frames) of ``options`` (frames 1 for an image family); ``ValueError`` naming the option
    unless each is a positive integer with H % (f p_h) = 0, W % (f p_w) = 0 and, for video, (F - 1) % f_t = 0."""
    keys = ("height", "width") + (("frames",) if grid.temporal is not None else ())
    size = {k: options.get(k) for k in keys}
    for k, v in size.items():
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"model.options.{k}: expected a positive integer, got {v!r}")
    for k, p in (("height", grid.patch_h), ("width", grid.patch_w)):
        m = grid.spatial * p
        if size[k] % m:
            raise ValueError(f"model.options.{k}: {size[k]} is not a multiple of {m} for {kind} (VAE factor "
                             f"{grid.spatial} x patch {p}); use e.g. {max(m, size[k] - size[k] % m)}")
    f = size.get("frames", 1)
    if grid.temporal is not None and (f - 1) % grid.temporal:
        raise ValueError(f"model.options.frames: {f} - 1 is not a multiple of {grid.temporal} for {kind} (the VAE's "
                         f"time factor); use e.g. {f - (f - 1) % grid.temporal}")
    return size["height"], size["width"], f


def _grid(spatial, patch_h, patch_w, temporal="image", patch_t=1) -> LatentGrid | None:
    values = (spatial, patch_h, patch_w, patch_t) + (() if temporal == "image" else (temporal,))
    ok = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)
    return LatentGrid(spatial, patch_h, patch_w, None if temporal == "image" else temporal, patch_t) if ok else None


def latent_grid(path: str, kind: str) -> LatentGrid | None:
    """The ``LatentGrid`` of the diffusers directory ``path`` from its VAE and transformer configs, as ``kind``'s
    pipeline derives it (SD3, FLUX: ``2 ** (len(block_out_channels) - 1)``; Qwen-Image: ``2 **
    len(temperal_downsample)``; Wan: ``scale_factor_spatial`` / ``_temporal``; HunyuanVideo:
    ``spatial_`` / ``temporal_compression_ratio``); None where a value is missing (the policy checks its
    loaded modules then)."""
    root = Path(path).expanduser()
    vae, tr = _json(root / "vae" / "config.json"), _json(root / "transformer" / "config.json")
    blocks, down, p = vae.get("block_out_channels"), vae.get("temperal_downsample"), tr.get("patch_size")
    if kind in ("sd3", "flux"):
        f = 2 ** (len(blocks) - 1) if isinstance(blocks, list) and blocks else None
        return _grid(f, p, p) if kind == "sd3" else _grid(f, 2, 2)
    if kind == "qwen_image":
        return _grid(2 ** len(down) if isinstance(down, list) else None, 2, 2)
    if kind == "wan":
        pt, ph, pw = p if isinstance(p, list) and len(p) == 3 else (None, None, None)
        return _grid(vae.get("scale_factor_spatial"), ph, pw, vae.get("scale_factor_temporal"), pt)
    if kind == "hunyuan_video":
        return _grid(vae.get("spatial_compression_ratio"), p, p, vae.get("temporal_compression_ratio"),
                     tr.get("patch_size_t"))
    return None


def check_resolution(path: str, kind: str, options: dict) -> None:
    """``ValueError`` naming ``model.options.height`` / ``width`` / ``frames`` when the sample size does not fit
    the directory's latent grid or (SD3) its transformer's position table."""
    grid = latent_grid(path, kind)
    if grid is None:
        return
    check_sample_size(kind, options, grid)
    if kind != "sd3":
        return
    root = Path(path).expanduser()
    f, p, limit = grid.spatial, grid.patch_h, _json(root / "transformer" / "config.json").get("pos_embed_max_size")
    for key in ("height", "width"):
        size = options[key]
        if isinstance(limit, int) and size // (f * p) > limit:
            raise ValueError(f"model.options.{key}: {size} px is {size // (f * p)} patches, over this SD3 "
                             f"transformer's pos_embed_max_size {limit} ({str(root)!r}); use at most "
                             f"{limit * f * p} px")


def check_sequence_split(path: str, kind: str, options: dict, degrees: dict[str, int]) -> None:
    """``models.sequence_parallel.check_degree`` of each sequence-parallel degree (key -> degree) on the
    directory's configs: the transformer's ``num_attention_heads`` and the latent tokens of ``options``' size."""
    if all(d == 1 for d in degrees.values()):  # (no sequence parallelism: nothing read)
        return
    grid = latent_grid(path, kind)
    heads = _json(Path(path).expanduser() / "transformer" / "config.json").get("num_attention_heads")
    if grid is None or not isinstance(heads, int):
        return
    from digenrl.models.sequence_parallel import check_degree

    tokens = grid.tokens(*check_sample_size(kind, options, grid))
    for key, degree in degrees.items():
        if degree > 1:
            check_degree(kind, heads, tokens, degree, key)
