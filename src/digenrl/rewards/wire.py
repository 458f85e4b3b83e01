"""The reward service's wire format (JSON over HTTP), shared by the server and the client.

Request ``POST /score``::

    {"images": {"dtype": "float32" | "uint8", "shape": [B, C, H, W] or [B, C, F, H, W], "data": <base64>},
     "prompts": [{"uid": int, "text": str, "meta": {...}}, ...]}

``uint8`` carries round(255 * x) (a quarter of the payload); ``float32`` is exact. Response::

    {"scores": [float, ...], "parts": {name: [float, ...]}}      or      {"error": str}  (HTTP 4xx / 5xx)
"""

from __future__ import annotations

import base64
from typing import Any, Sequence

import numpy as np
import torch

from digenrl.rollout.records import Prompt

WIRE_DTYPES = ("float32", "uint8")


def encode_images(images: torch.Tensor, dtype: str = "float32") -> dict[str, Any]:
    if dtype not in WIRE_DTYPES:
        raise ValueError(f"wire dtype must be one of {WIRE_DTYPES}, got {dtype!r}")
    x = images.detach().float().cpu()
    arr = (x.clamp(0, 1) * 255).round().to(torch.uint8).numpy() if dtype == "uint8" else x.numpy()
    return {"dtype": dtype, "shape": list(arr.shape), "data": base64.b64encode(arr.tobytes()).decode("ascii")}


def decode_images(obj: dict[str, Any]) -> torch.Tensor:
    dtype = obj.get("dtype")
    if dtype not in WIRE_DTYPES:
        raise ValueError(f"images.dtype must be one of {WIRE_DTYPES}, got {dtype!r}")
    shape = [int(s) for s in obj["shape"]]
    if len(shape) not in (4, 5):
        raise ValueError(f"images.shape must have 4 or 5 dims, got {shape}")
    arr = np.frombuffer(base64.b64decode(obj["data"]), dtype=np.dtype(dtype))
    if arr.size != int(np.prod(shape)):
        raise ValueError(f"images.data holds {arr.size} values, shape {shape} needs {int(np.prod(shape))}")
    t = torch.from_numpy(arr.copy()).view(*shape)
    return t.float() / 255.0 if dtype == "uint8" else t


def encode_prompts(prompts: Sequence[Prompt]) -> list[dict[str, Any]]:
    return [{"uid": int(p.uid), "text": p.text, "meta": _jsonable(p.meta)} for p in prompts]


def decode_prompts(items: Sequence[dict[str, Any]]) -> list[Prompt]:
    return [Prompt(uid=int(d["uid"]), text=str(d["text"]), meta=dict(d.get("meta") or {})) for d in items]


def _jsonable(meta: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in meta.items():
        if isinstance(v, torch.Tensor):
            v = v.tolist()
        elif isinstance(v, np.ndarray):
            v = v.tolist()
        out[str(k)] = v
    return out
