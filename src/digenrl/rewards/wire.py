"""The reward service's wire format (JSON over HTTP), shared by the server and the client.

Request ``POST /score``::

    {"images": {"dtype": "float32" | "uint8", "shape": [B, C, H, W] or [B, C, F, H, W], "data": <base64>},
     "prompts": [{"uid": int, "text": str, "meta": {...}}, ...]}

``uint8`` carries round(255 * x) (a quarter of the payload); ``float32`` is exact. Response::

    {"scores": [float, ...], "parts": {name: [float, ...]}}      or      {"error": str}  (HTTP 4xx / 5xx)
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Annotated, Any, Literal, Sequence

import numpy as np
import torch
from pydantic import BaseModel, Field, ValidationError

from digenrl.rollout.records import Prompt

WIRE_DTYPES = ("float32", "uint8")


class WireError(ValueError):
    """A request that does not follow the wire format; the message says which field is wrong."""


def encode_images(images: torch.Tensor, dtype: str = "float32") -> dict[str, Any]:
    if dtype not in WIRE_DTYPES:
        raise ValueError(f"wire dtype must be one of {WIRE_DTYPES}, got {dtype!r}")
    x = images.detach().float().cpu()
    arr = (x.clamp(0, 1) * 255).round().to(torch.uint8).numpy() if dtype == "uint8" else x.numpy()
    return {"dtype": dtype, "shape": list(arr.shape), "data": base64.b64encode(arr.tobytes()).decode("ascii")}


class WireImages(BaseModel):
    dtype: Literal["float32", "uint8"]
    shape: Annotated[list[Annotated[int, Field(strict=True, ge=1)]], Field(min_length=4, max_length=5)]
    data: str


class WirePrompt(BaseModel):
    uid: Annotated[int, Field(strict=True)]
    text: Annotated[str, Field(strict=True)]
    meta: dict[str, Any] | None = None


class WireRequest(BaseModel):
    images: WireImages
    prompts: list[WirePrompt]


def decode_images(obj: WireImages) -> torch.Tensor:
    try:
        raw = base64.b64decode(obj.data, validate=True)
    except (binascii.Error, ValueError):
        raise WireError("images.data is not valid base64") from None
    itemsize, need = np.dtype(obj.dtype).itemsize, math.prod(obj.shape)
    if len(raw) != need * itemsize:
        raise WireError(f"images.data holds {len(raw) // itemsize} values, shape {obj.shape} needs {need}")
    t = torch.from_numpy(np.frombuffer(raw, dtype=np.dtype(obj.dtype)).copy()).view(*obj.shape)
    if obj.dtype == "uint8":
        return t.float() / 255.0
    if not torch.isfinite(t).all():
        raise WireError("images hold NaN or infinite values")
    return t


def encode_prompts(prompts: Sequence[Prompt]) -> list[dict[str, Any]]:
    return [{"uid": int(p.uid), "text": p.text, "meta": _jsonable(p.meta)} for p in prompts]


def decode_request(req: Any) -> tuple[torch.Tensor, list[Prompt]]:
    """A parsed ``POST /score`` body -> (images, prompts); ``WireError`` names the first bad field."""
    try:
        r = WireRequest.model_validate(req)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "the request body (a JSON object)"
        raise WireError(f"{where}: {err['msg']}") from None
    images = decode_images(r.images)
    prompts = [Prompt(uid=p.uid, text=p.text, meta=dict(p.meta or {})) for p in r.prompts]
    if images.shape[0] != len(prompts):
        raise WireError(f"{images.shape[0]} images but {len(prompts)} prompts")
    return images, prompts


def _jsonable(meta: dict[str, Any]) -> dict[str, Any]:
    return {str(k): v.tolist() if isinstance(v, (torch.Tensor, np.ndarray)) else v for k, v in meta.items()}
