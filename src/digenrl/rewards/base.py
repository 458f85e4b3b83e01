"""Reward function interface and weighted composition.

A reward function maps decoded images (float in [0, 1], [B, C, H, W] or video [B, C, F, H, W]) and their
prompts (``Prompt``: ``uid``, ``text``, ``meta`` -- e.g. GenEval's object metadata) to one score per sample,
a float tensor [B] on any device. It may also define ``score(images, prompts) -> (scores, info)`` where
``info`` maps names to per-sample tensors [B] (a breakdown or diagnostics, logged as ``reward/<name>/<key>``).

``WeightedSum`` composes several: r = sum_k w_k r_k, keeping each r_k (and each part's own breakdown, as
``"<name>/<key>"``) for logging. It is the boundary where scores enter a run: each part's output must be a 1-D
floating-point tensor with one finite score per sample, else ``RewardOutputError`` names the reward (and the
first bad sample); a NaN that got through would make every weight NaN at the next commit. A part that raises
is named the same way (``RewardRaised``: ``reward.judge: raised RuntimeError: ...``), so a run stops on it with
one line and ``failure.json`` instead of a traceback; only what a retry can fix passes through unchanged
(``OSError``, out of memory, the reward service unavailable past its client's window).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, Sequence

import numpy as np
import torch

from digenrl.faults import RunHalted
from digenrl.rollout.records import Prompt


class RewardOutputError(RunHalted):
    """A reward function returned something other than one finite float score per sample."""


class RewardRaised(RewardOutputError):
    """A reward function raised instead of returning scores (its exception is the ``__cause__``)."""


TRANSIENT = (OSError, MemoryError, torch.OutOfMemoryError)  # a retry (or a worker restart) may get past these


def _transient(e: BaseException) -> bool:
    return isinstance(e, TRANSIENT) or type(e).__name__ == "RewardServiceError"  # (rewards.client; no import)


def check_scores(name: str, value, n: int) -> torch.Tensor:
    """``value`` as a float CPU tensor [n] if it is one finite score per sample, else ``RewardOutputError``."""
    where = f"reward.{name}"
    if not isinstance(value, torch.Tensor):
        raise RewardOutputError(f"{where}: returned a {type(value).__name__}, expected a float tensor of {n} scores")
    if not value.is_floating_point():
        raise RewardOutputError(f"{where}: returned a {value.dtype} tensor, expected a float tensor of {n} scores")
    if tuple(value.shape) != (n,):
        raise RewardOutputError(f"{where}: returned scores of shape {tuple(value.shape)} for a batch of {n} "
                                f"samples, expected shape ({n},)")
    v = value.detach().float().cpu()
    bad = (~torch.isfinite(v)).nonzero().flatten().tolist()
    if bad:
        raise RewardOutputError(f"{where}: score {v[bad[0]].item()} of sample {bad[0]} (of {n}) is not finite"
                                + (f" ({len(bad)} samples are not)" if len(bad) > 1 else ""))
    return v


def check_url(where: str, url: str) -> None:
    """``ValueError`` naming ``where`` (e.g. ``reward remote: url``) unless ``url`` is http(s)."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"{where} must start with http:// or https://, got {url[:80]!r}")


def model_dir(where: str, path: str) -> Path:
    """A local transformers model directory (with its ``config.json``); ``FileNotFoundError`` naming ``where``."""
    p = Path(path).expanduser()
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"{where} {str(p)!r} holds no model (config.json missing)")
    return p


def rgb_frames(images: torch.Tensor, what: str, n: int | None = None) -> np.ndarray:
    """Images [B, C, H, W] or videos [B, C, F, H, W] in [0, 1] (C = 1 or 3; ``n``: the expected B) -> 8-bit RGB
    frames [B, F, H, W, 3] (F = 1 for images): round(255 x), what a saved image holds; grey is replicated."""
    x = images.detach().float().cpu().clamp(0, 1)
    x = x.unsqueeze(2) if x.ndim == 4 else x
    if x.ndim != 5 or x.shape[1] not in (1, 3) or (n is not None and x.shape[0] != n):
        raise ValueError(f"{what}: expected images [B, 1|3, H, W] or videos [B, 1|3, F, H, W]"
                         f"{'' if n is None else f' for {n} prompts'}, got {tuple(images.shape)}")
    return (x.expand(-1, 3, -1, -1, -1) * 255).round().to(torch.uint8).permute(0, 2, 3, 4, 1).numpy()


def png_base64(rgb: np.ndarray, size: int | None = None) -> str:
    """An HxWx3 uint8 RGB image as a base64 PNG (resized to ``size`` x ``size`` first if ``size``)."""
    import base64
    import io

    from PIL import Image

    img, buf = Image.fromarray(rgb), io.BytesIO()
    (img.resize((size, size)) if size else img).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


class RewardFn(Protocol):
    name: str

    def __call__(self, images: torch.Tensor, prompts: Sequence[Prompt]) -> torch.Tensor: ...


class Scored:
    """A reward that defines ``score(images, prompts) -> (scores, info)``: calling it gives the scores."""

    def __call__(self, images: torch.Tensor, prompts: Sequence[Prompt]) -> torch.Tensor:
        return self.score(images, prompts)[0]  # type: ignore[attr-defined]


class WeightedSum(Scored):
    """r = sum_k w_k * r_k(images, prompts); ``parts`` returns each r_k too."""

    def __init__(self, parts: dict[str, tuple[float, RewardFn]]):
        if not parts:
            raise ValueError("reward: at least one reward function is required")
        self._parts = parts
        self.name = "+".join(parts)

    def score(self, images: torch.Tensor, prompts: Sequence[Prompt]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        values: dict[str, torch.Tensor] = {}
        extra: dict[str, torch.Tensor] = {}
        n = len(images)
        for name, (_, fn) in self._parts.items():
            try:
                if hasattr(fn, "score"):
                    v, info = fn.score(images, prompts)
                    for key, part in info.items():
                        if key != name:
                            extra[f"{name}/{key}"] = part.float().cpu().reshape(-1)
                else:
                    v = fn(images, prompts)
            except RunHalted:
                raise
            except Exception as e:
                if _transient(e):
                    raise
                raise RewardRaised(f"reward.{name}: raised {type(e).__name__}: {str(e)[:300]}") from e
            values[name] = check_scores(name, v, n)
        total = sum(self._parts[name][0] * v for name, v in values.items())
        if not torch.isfinite(total).all():  # finite parts times finite weights can still overflow
            i = int((~torch.isfinite(total)).nonzero()[0])
            raise RewardOutputError(f"reward: the weighted sum {total[i].item()} of sample {i} (of {n}) is not finite")
        return total, {**values, **extra}
