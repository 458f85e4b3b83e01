"""Shared pieces of the rewards that load a published checkpoint from a local file onto transformers modules
(``hpsv2``, ``image_reward``): typed options, the device default, reading the checkpoint, a strict key-for-key
load that names every missing / unexpected key, and the frame-by-frame call (``LocalWeightsReward``). Nothing
is downloaded: the checkpoint and the tokenizer are local paths, checked before anything is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Literal, Sequence

import torch
from pydantic import BaseModel, ConfigDict, Field

from digenrl.models.diffusers_files import DTYPES
from digenrl.rewards.base import rgb_frames

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # OpenAI CLIP's image mean / std (open_clip OPENAI_DATASET_*),
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)  # used by HPSv2 and by ImageReward's transform


class LocalWeightsOptions(BaseModel):
    """Options every local-weights preference reward takes (each reward adds its own)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    checkpoint_path: str  # the published checkpoint file (.pt / .pth / .bin / .safetensors)
    tokenizer_path: str  # a local tokenizer directory (transformers ``from_pretrained`` layout)
    device: str | None = None  # None: the worker's device (its CUDA device when it has one, else CPU)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    batch_size: int = Field(16, ge=1)  # images per forward pass
    vision_heads: int = Field(16, ge=1)  # head counts: not stored in the weights
    text_heads: int = Field(16, ge=1)


def resolve_device(device: str | None) -> torch.device:
    """``None`` -> the device this process computes on: the current CUDA device (the GPU Ray or the launcher
    assigned to this worker) when CUDA is available, else the CPU."""
    if device is not None:
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def read_checkpoint(path: str, what: str, option: str = "checkpoint_path") -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint file: a safetensors file, or a torch pickle read with ``weights_only`` (a
    training checkpoint's ``state_dict`` / ``model`` entry is unwrapped; a ``module.`` prefix from DDP is
    dropped). ``option``: the reward option that named the file (for the error)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"reward {what}: {option} {str(p)!r} does not exist")
    if p.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(p))
    else:
        try:
            state = torch.load(str(p), map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # not a zip checkpoint: mmap needs one
            state = torch.load(str(p), map_location="cpu", weights_only=True)
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
            break
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"reward {what}: {str(p)!r} holds no state dict of tensors")
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module.") :]: v for k, v in state.items()}
    return state


def _names(keys: Iterable[str], limit: int = 6) -> str:
    keys = sorted(keys)
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def load_strict(model: torch.nn.Module, state: dict[str, torch.Tensor], what: str, path: str) -> None:
    """Load ``state`` (already renamed to ``model``'s keys) into a model built on the meta device: every
    parameter and persistent buffer must be given, with its shape, and nothing else; the error names the keys
    (so a checkpoint of another architecture, or a wrong mapping, never scores with random weights).
    Non-persistent ``position_ids`` buffers (``arange``) are rebuilt."""
    expected = model.state_dict()
    missing = set(expected) - set(state)
    unexpected = set(state) - set(expected)
    if missing or unexpected:
        parts = [f"missing {_names(missing)}" if missing else "", f"unexpected {_names(unexpected)}" if unexpected else ""]
        raise ValueError(f"reward {what}: {path!r} does not match the model: " + "; ".join(p for p in parts if p))
    bad = [f"{k} {tuple(state[k].shape)} (expected {tuple(v.shape)})" for k, v in expected.items()
           if tuple(state[k].shape) != tuple(v.shape)]  # fmt: skip
    if bad:
        raise ValueError(f"reward {what}: {path!r} has tensors of the wrong shape: {_names(bad)}")
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()}, strict=True, assign=True)
    for name, buf in list(model.named_buffers()):
        if not buf.is_meta:
            continue
        if not name.endswith("position_ids"):
            raise ValueError(f"reward {what}: buffer {name} was not initialised")
        owner = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
        owner.register_buffer("position_ids", torch.arange(buf.shape[-1]).expand(buf.shape), persistent=False)


def layer_count(state: dict[str, torch.Tensor], prefix: str) -> int:
    """The number of blocks ``prefix{i}.`` in ``state`` (0 .. n-1 must all be present)."""
    ids = {int(k[len(prefix) :].split(".", 1)[0]) for k in state if k.startswith(prefix)}
    if ids != set(range(len(ids))):
        raise ValueError(f"blocks {prefix}N are not numbered 0..{len(ids) - 1}: {sorted(ids)}")
    return len(ids)


def per_sample(values: torch.Tensor, frames: int) -> torch.Tensor:
    """Frame scores [B * F] -> the mean per sample [B] (float32, CPU)."""
    return values.float().view(-1, frames).mean(dim=1).cpu()


class LocalWeightsReward:
    """What ``hpsv2`` and ``image_reward`` share: ``check`` (the paths), ``_read`` (the options and the checkpoint,
    refused without the keys of its layout) and the call, over the subclass's ``frame_scores``."""

    name: str
    options_model: type[LocalWeightsOptions] = LocalWeightsOptions

    @classmethod
    def check(cls, checkpoint_path: str | None = None, tokenizer_path: str | None = None, **_) -> None:
        """What can be checked without loading: the checkpoint file and the tokenizer directory exist."""
        if not checkpoint_path or not Path(checkpoint_path).expanduser().is_file():
            raise FileNotFoundError(f"reward {cls.name}: checkpoint_path {str(checkpoint_path)!r} does not exist")
        if not tokenizer_path or not Path(tokenizer_path).expanduser().is_dir():
            raise FileNotFoundError(f"reward {cls.name}: tokenizer_path {str(tokenizer_path)!r} is not a directory")

    def _read(self, options: dict, layout: str, keys: Sequence[str]) -> dict[str, torch.Tensor]:
        o = self.options = self.options_model(**options)
        state = read_checkpoint(o.checkpoint_path, self.name)
        missing = [k for k in keys if k not in state]
        if missing:
            raise ValueError(f"reward {self.name}: {o.checkpoint_path!r} is not {layout} (no {missing})")
        self.device, self.dtype = resolve_device(o.device), DTYPES[o.dtype]
        return state

    def frame_scores(self, frames: torch.Tensor, texts: Sequence[str]) -> torch.Tensor:
        raise NotImplementedError

    def __call__(self, images: torch.Tensor, prompts: Sequence) -> torch.Tensor:
        """One score per sample: every frame (8-bit [N, 3, H, W], ``base.rgb_frames``) is scored with its prompt's
        text by ``frame_scores`` in batches of ``batch_size``, and a video gets the mean over its frames."""
        arr, n = rgb_frames(images, f"reward {self.name}"), self.options.batch_size
        frames, f = torch.from_numpy(arr.reshape(-1, *arr.shape[2:])).permute(0, 3, 1, 2), arr.shape[1]
        texts = [p.text for p in prompts for _ in range(f)]
        if len(texts) != frames.shape[0]:
            raise ValueError(f"reward {self.name}: {len(prompts)} prompts for {frames.shape[0] // f} samples")
        return per_sample(torch.cat([self.frame_scores(frames[i : i + n], texts[i : i + n])
                                     for i in range(0, len(texts), n)]), f)  # fmt: skip
