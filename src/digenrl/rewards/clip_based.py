"""CLIP-based rewards from local weights: CLIPScore, PickScore and the LAION aesthetic predictor.

All three embed images with a ``transformers.CLIPModel`` loaded offline (``local_files_only``) from a local
directory (``model_path``) and preprocess with its ``CLIPProcessor`` (8-bit RGB, resize, centre crop,
normalise). With unit-normalised embeddings e_img, e_txt:

* ``clipscore`` (Hessel et al. 2021): r = w * max(cos(e_img, e_txt), 0), w = ``scale`` (2.5 in the paper).
  ``variant: flow_grpo`` gives Flow-GRPO's ``clip_scorer.py`` instead: r = exp(logit_scale) * cos / 30
  (no clamp; ``scale`` unused).
* ``pickscore`` (Kirstain et al. 2023; weights ``yuvalkirstain/PickScore_v1`` on a CLIP-H processor):
  r = ``scale`` * exp(logit_scale) * cos(e_img, e_txt). Flow-GRPO divides by 26 (``scale = 1/26``).
* ``aesthetic`` (LAION improved aesthetic predictor v2, CLIP ViT-L/14): an MLP head on e_img,
  768 -> 1024 -> 128 -> 64 -> 16 -> 1 (dropout between the first layers, no activations), loaded from a
  local ``.safetensors`` or ``.pt`` state dict (``head_path``; keys ``layers.{0,2,4,6,7}.{weight,bias}``,
  optionally prefixed). r = head(e_img).

Videos ``[B, C, F, H, W]`` score the mean over frames. Every missing file is a clear error naming the path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Sequence

import torch

from digenrl.rewards.base import rgb_frames
from digenrl.rewards.local_weights import per_sample, read_checkpoint, resolve_device


def _check_dir(path: str | None, what: str) -> Path:
    if not path:
        raise ValueError(f"reward {what}: option model_path (a local CLIP directory) is required")
    p = Path(path).expanduser()
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"reward {what}: no CLIP model at {str(p)!r} (config.json missing)")
    return p


def _features(out) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out.pooler_output


class ClipEmbedder:
    """CLIP image / text embeddings (unit-normalised) from a local model directory."""

    def __init__(self, model_path: str, what: str, device: str | None = None, processor_path: str | None = None):
        from transformers import CLIPModel, CLIPProcessor

        path, self.what = _check_dir(model_path, what), what
        self.device = resolve_device(device)  # None: the worker's device
        self.model = CLIPModel.from_pretrained(str(path), local_files_only=True).eval().to(self.device)
        self.processor = CLIPProcessor.from_pretrained(str(processor_path or path), local_files_only=True)

    @torch.no_grad()
    def images(self, images: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Embeddings of every frame, [B * F, D], and F (1 for images)."""
        arr = rgb_frames(images, f"reward {self.what}")
        return self.arrays(list(arr.reshape(-1, *arr.shape[2:]))), arr.shape[1]

    @torch.no_grad()
    def arrays(self, images: Sequence) -> torch.Tensor:
        """Unit embeddings [N, D] of HxWx3 uint8 RGB arrays (any sizes: the processor resizes and crops)."""
        pix = self.processor(images=list(images), return_tensors="pt", input_data_format="channels_last")
        pix = pix["pixel_values"].to(self.device)
        emb = _features(self.model.get_image_features(pixel_values=pix)).float()
        return torch.nn.functional.normalize(emb, dim=-1)

    @torch.no_grad()
    def texts(self, texts: Sequence[str]) -> torch.Tensor:
        tok = self.processor(text=list(texts), padding=True, truncation=True, return_tensors="pt")
        tok = {k: v.to(self.device) for k, v in tok.items() if k in ("input_ids", "attention_mask")}
        emb = _features(self.model.get_text_features(**tok)).float()
        return torch.nn.functional.normalize(emb, dim=-1)


    def cosine(self, images: torch.Tensor, prompts: Sequence) -> tuple[torch.Tensor, int]:
        """cos(e_img, e_txt) of every frame with its sample's prompt, [B * F], and F."""
        img, frames = self.images(images)
        return (img * self.texts([p.text for p in prompts]).repeat_interleave(frames, dim=0)).sum(-1), frames


class ClipScore:
    name = "clipscore"

    @staticmethod
    def check(model_path: str | None = None, **_) -> None:
        _check_dir(model_path, "clipscore")

    def __init__(self, model_path: str | None = None, scale: float = 2.5, device: str | None = None,
                 variant: Literal["hessel", "flow_grpo"] = "hessel"):  # fmt: skip
        self.clip, self.scale, self.variant = ClipEmbedder(model_path, self.name, device), float(scale), variant

    def __call__(self, images: torch.Tensor, prompts: Sequence) -> torch.Tensor:
        cos, frames = self.clip.cosine(images, prompts)
        if self.variant == "flow_grpo":
            return per_sample(self.clip.model.logit_scale.exp().float().item() * cos / 30.0, frames)
        return per_sample(self.scale * cos.clamp_min(0), frames)


class PickScore:
    name = "pickscore"

    @staticmethod
    def check(model_path: str | None = None, processor_path: str | None = None, **_) -> None:
        _check_dir(model_path, "pickscore")
        if processor_path is not None and not Path(processor_path).expanduser().is_dir():
            raise FileNotFoundError(f"reward pickscore: processor_path {processor_path!r} is not a directory")

    def __init__(self, model_path: str | None = None, processor_path: str | None = None, scale: float = 1.0,
                 device: str | None = None):  # fmt: skip
        self.clip, self.scale = ClipEmbedder(model_path, self.name, device, processor_path), float(scale)

    def __call__(self, images: torch.Tensor, prompts: Sequence) -> torch.Tensor:
        cos, frames = self.clip.cosine(images, prompts)
        return per_sample(self.scale * self.clip.model.logit_scale.exp().float().item() * cos, frames)


def aesthetic_head(dim: int) -> torch.nn.Sequential:
    """The LAION aesthetic MLP (layer indices match the published state dict)."""
    nn = torch.nn
    return nn.Sequential(
        nn.Linear(dim, 1024), nn.Dropout(0.2), nn.Linear(1024, 128), nn.Dropout(0.2),
        nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16), nn.Linear(16, 1),
    )  # fmt: skip


def _head_path(path: str | None) -> Path:
    if not path:
        raise ValueError("reward aesthetic: option head_path (the MLP head .safetensors / .pt) is required")
    if not Path(path).expanduser().is_file():
        raise FileNotFoundError(f"reward aesthetic: head_path {path!r} does not exist")
    return Path(path).expanduser()


class AestheticScore:
    name = "aesthetic"

    @staticmethod
    def check(model_path: str | None = None, head_path: str | None = None, **_) -> None:
        _check_dir(model_path, "aesthetic")
        _head_path(head_path)

    def __init__(self, model_path: str | None = None, head_path: str | None = None, device: str | None = None):
        self.clip = ClipEmbedder(model_path, self.name, device)
        p, state = _head_path(head_path), {}
        for k, v in read_checkpoint(head_path, "aesthetic", option="head_path").items():
            idx = k.find("layers.")
            if idx < 0:
                raise ValueError(f"reward aesthetic: unexpected key {k!r} in {str(p)!r} (expected layers.N.weight)")
            state[k[idx + len("layers.") :]] = v
        self.head = aesthetic_head(state["0.weight"].shape[1])
        self.head.load_state_dict(state)
        self.head.eval().to(self.clip.device)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: Sequence) -> torch.Tensor:
        img, frames = self.clip.images(images)
        return per_sample(self.head(img).squeeze(-1), frames)
