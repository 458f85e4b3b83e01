"""``model.options`` typed per model family: the keys each family reads, their types, and the refusal of any
other key (``model.options.hieght=32``: the key, the family's options and the closest one).

Light (pydantic only: no torch, no diffusers), so ``config.py`` checks the options while it validates a config,
before anything is built. A family adapter that reads a new option must declare it here.
"""

from __future__ import annotations

import difflib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from digenrl.models.specs import SPECS


class _Options(BaseModel):
    # strict: "32" is not a height, true is not a batch size (the adapters use the values as they are)
    model_config = ConfigDict(extra="forbid", strict=True, use_attribute_docstrings=True)


class TinyDiTOptions(_Options):
    """The built-in demo model takes no options (its shape is in its checkpoint)."""


class ImageOptions(_Options):
    """Options every diffusers family reads (``models.diffusers_common``)."""

    height: int = Field(512, gt=0)
    """Sample height in pixels (a multiple of the VAE factor x patch size; the family's default when unset)."""
    width: int = Field(512, gt=0)
    """Sample width in pixels."""
    max_sequence_length: int = Field(256, gt=0)
    """Text tokens of the long text encoder (T5 / UMT5 / Qwen2.5-VL / Llama); part of the prompt cache's encoder id."""
    negative_prompt: str = ""
    """The unconditional prompt of classifier-free guidance."""
    load_text_encoders: Literal["auto"] | bool = "auto"
    """auto: skip the text encoders when model.prompt_cache_dir holds every prompt; false: never load them."""
    reference_copy: bool = True
    """Full fine-tuning: keep a frozen copy of the weights as the KL reference."""
    prompt_cache_rows: int = Field(4096, ge=1)
    """Prompt-cache rows kept in memory (LRU)."""
    vae_batch: int | None = Field(None, ge=1)
    """Decode at most this many samples per VAE call (bounds the decoder's memory)."""
    vae_tiling: bool = False
    """diffusers' tiled VAE decoding (large images, long videos)."""
    vae_slicing: bool = False
    """diffusers' per-sample VAE decoding."""


class VideoOptions(ImageOptions):
    """Video families (Wan2.1, HunyuanVideo): the image options and the frame count."""

    frames: int = Field(33, gt=0)
    """Frames per video (frames - 1 a multiple of the VAE's temporal factor)."""


FAMILY_OPTIONS: dict[str, type[_Options]] = {  # a video family of the model registry takes frames
    "tiny_dit": TinyDiTOptions, **{k: VideoOptions if s.video else ImageOptions for k, s in SPECS.items()}}


def did_you_mean(word: str, choices, prefix: str = "") -> str:
    """``"; did you mean X?"`` for the closest of ``choices`` (difflib), or ``""``."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean {prefix}{close[0]}?" if close else ""


def check_options(kind: str, options: dict) -> None:
    """Raise ``ValueError`` naming ``model.options.<key>`` for an option ``kind`` does not read or a value of the
    wrong type. An unknown ``kind`` is not checked here (``validate.check_model`` refuses it)."""
    model = FAMILY_OPTIONS.get(kind)
    if model is None or not isinstance(options, dict):
        return
    try:
        model.model_validate(options)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        names = sorted(model.model_fields)
        if err["type"] == "extra_forbidden":
            if not names:
                raise ValueError(f"model.options.{key}: model.kind={kind} takes no options; remove it") from None
            raise ValueError(f"model.options.{key}: not an option of model.kind={kind}"
                             f"{did_you_mean(key, names, 'model.options.')} ({kind}'s options: "
                             f"{', '.join(names)})") from None
        raise ValueError(f"model.options.{key}: {err['msg']} (got {str(err.get('input'))[:60]!r})") from None
