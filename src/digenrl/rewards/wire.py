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
from typing import Any, Sequence

import numpy as np
import torch

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


def decode_images(obj: Any) -> torch.Tensor:
    if not isinstance(obj, dict):
        raise WireError(f"images must be an object with dtype, shape, data; got {type(obj).__name__}")
    dtype = obj.get("dtype")
    if dtype not in WIRE_DTYPES:
        raise WireError(f"images.dtype must be one of {WIRE_DTYPES}, got {str(dtype)[:40]!r}")
    shape = obj.get("shape")
    if not isinstance(shape, list) or len(shape) not in (4, 5):
        raise WireError(f"images.shape must be a list of 4 or 5 dims, got {str(shape)[:80]}")
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in shape):
        raise WireError(f"images.shape must hold positive integers, got {str(shape)[:80]}")
    data = obj.get("data")
    if not isinstance(data, str):
        raise WireError("images.data must be a base64 string")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise WireError("images.data is not valid base64") from None
    itemsize = np.dtype(dtype).itemsize
    need = math.prod(shape)
    if len(raw) != need * itemsize:
        raise WireError(f"images.data holds {len(raw) // itemsize} values, shape {shape} needs {need}")
    arr = np.frombuffer(raw, dtype=np.dtype(dtype))
    t = torch.from_numpy(arr.copy()).view(*shape)
    if dtype == "uint8":
        return t.float() / 255.0
    if not torch.isfinite(t).all():
        raise WireError("images hold NaN or infinite values")
    return t


def encode_prompts(prompts: Sequence[Prompt]) -> list[dict[str, Any]]:
    return [{"uid": int(p.uid), "text": p.text, "meta": _jsonable(p.meta)} for p in prompts]


def decode_prompts(items: Any) -> list[Prompt]:
    if not isinstance(items, list):
        raise WireError(f"prompts must be a list, got {type(items).__name__}")
    out = []
    for i, d in enumerate(items):
        if not isinstance(d, dict):
            raise WireError(f"prompts[{i}] must be an object with uid, text, meta")
        uid, text, meta = d.get("uid"), d.get("text"), d.get("meta") or {}
        if not isinstance(uid, int) or isinstance(uid, bool):
            raise WireError(f"prompts[{i}].uid must be an integer")
        if not isinstance(text, str):
            raise WireError(f"prompts[{i}].text must be a string")
        if not isinstance(meta, dict):
            raise WireError(f"prompts[{i}].meta must be an object")
        out.append(Prompt(uid=uid, text=text, meta=dict(meta)))
    return out


def decode_request(req: Any) -> tuple[torch.Tensor, list[Prompt]]:
    """A parsed ``POST /score`` body -> (images, prompts); ``WireError`` names the first bad field."""
    if not isinstance(req, dict):
        raise WireError(f"the request body must be a JSON object, got {type(req).__name__}")
    for key in ("images", "prompts"):
        if key not in req:
            raise WireError(f"the request has no {key!r} field")
    images, prompts = decode_images(req["images"]), decode_prompts(req["prompts"])
    if images.shape[0] != len(prompts):
        raise WireError(f"{images.shape[0]} images but {len(prompts)} prompts")
    return images, prompts


def _jsonable(meta: dict[str, Any]) -> dict[str, Any]:
    return {str(k): v.tolist() if isinstance(v, (torch.Tensor, np.ndarray)) else v for k, v in meta.items()}
