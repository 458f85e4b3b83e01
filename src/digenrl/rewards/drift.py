"""Image-statistics drift of a set of samples against a reference set (the base model's eval samples): the
"drift" guard of ``eval.guard`` (``observe.hacking_guard``). Torch only; nothing is learnt or loaded.

Images ``x`` are floats in [0, 1], ``[N, C, H, W]`` (a video ``[N, C, F, H, W]`` counts each frame as an image).
Three statistics of a set, each computed over every pixel of every image of the set:

* colour histogram ``h_c[b]``: the fraction of channel ``c``'s values in bin ``b`` of ``bins`` equal bins over
  [0, 1] (a value of 1 falls in the last bin); ``sum_b h_c[b] = 1``;
* mean saturation ``S``: HSV saturation ``s = (max_c x - min_c x) / max_c x`` per pixel (``s = 0`` where
  ``max_c x = 0``, and for a single-channel image), averaged;
* background uniformity ``U``: each image is cut into non-overlapping ``patch x patch`` tiles (the remainder
  rows / columns are dropped; ``patch`` is capped at the image's smaller side); a tile is *flat* when the
  population standard deviation of its values (all its pixels and channels) is below ``flat_std``; ``U`` is the
  fraction of flat tiles. A reward hack that blanks the background (an OCR reward, UniRL #407) raises ``U``.

Against the reference statistics ``(h0, S0, U0)``:

* ``hist = (1 / C) sum_c 1/2 sum_b |h_c[b] - h0_c[b]|`` (total variation distance, in [0, 1]);
* ``saturation = S - S0`` and ``uniformity = U - U0`` (signed, each in [-1, 1]);
* ``D = max(hist, |saturation|, |uniformity|)`` in [0, 1], and the guard value ``drift = 1 - D``: 1 for samples
  with the reference's statistics (the base model's own samples give exactly 1), falling as they drift.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ImageStats:
    """The statistics of a set of images (see the module docstring)."""

    hist: torch.Tensor  # [C, bins], each row sums to 1
    saturation: float
    uniformity: float

    def as_dict(self) -> dict:
        """JSON-able (a checkpoint's counters keep the base statistics for a resumed run)."""
        return {"hist": self.hist.tolist(), "saturation": self.saturation, "uniformity": self.uniformity}

    @classmethod
    def from_dict(cls, d: dict) -> "ImageStats":
        return cls(torch.tensor(d["hist"], dtype=torch.float64), float(d["saturation"]), float(d["uniformity"]))


def as_frames(images: torch.Tensor) -> torch.Tensor:
    """``[N, C, H, W]`` (a video ``[N, C, F, H, W]``: its frames as images) as float64 on the CPU."""
    x = images.detach().to("cpu", torch.float64)
    if x.ndim == 5:
        x = x.permute(0, 2, 1, 3, 4).reshape(-1, x.shape[1], x.shape[3], x.shape[4])
    if x.ndim != 4:
        raise ValueError(f"eval.guard.drift: images must be [N, C, H, W] or [N, C, F, H, W], got {tuple(images.shape)}")
    return x.clamp(0.0, 1.0)


def colour_histogram(x: torch.Tensor, bins: int) -> torch.Tensor:
    """``[C, bins]``: per channel, the fraction of its values in each of ``bins`` equal bins over [0, 1]."""
    idx = (x * bins).long().clamp_(0, bins - 1)  # [N, C, H, W]; 1.0 -> the last bin
    c = x.shape[1]
    flat = idx.permute(1, 0, 2, 3).reshape(c, -1)
    counts = torch.zeros(c, bins, dtype=torch.float64).scatter_add_(1, flat, torch.ones_like(flat, dtype=torch.float64))
    return counts / flat.shape[1]


def mean_saturation(x: torch.Tensor) -> float:
    """Mean HSV saturation ``(max_c - min_c) / max_c`` (0 where ``max_c = 0`` and for one channel)."""
    if x.shape[1] < 2:
        return 0.0
    hi, lo = x.amax(dim=1), x.amin(dim=1)
    s = torch.where(hi > 0, (hi - lo) / hi.clamp_min(1e-12), torch.zeros_like(hi))
    return float(s.mean())


def flat_fraction(x: torch.Tensor, patch: int, flat_std: float) -> float:
    """The fraction of ``patch x patch`` tiles whose values' population std is below ``flat_std``."""
    n, c, h, w = x.shape
    p = max(1, min(patch, h, w))
    x = x[:, :, : h // p * p, : w // p * p]
    tiles = x.reshape(n, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5).reshape(n, (h // p) * (w // p), -1)
    std = tiles.std(dim=-1, unbiased=False)
    return float((std < flat_std).double().mean())


def image_stats(images: torch.Tensor, *, bins: int = 16, patch: int = 8, flat_std: float = 0.02) -> ImageStats:
    x = as_frames(images)
    return ImageStats(colour_histogram(x, bins), mean_saturation(x), flat_fraction(x, patch, flat_std))


def drift(ref: ImageStats, cur: ImageStats) -> dict[str, float]:
    """``{"drift": 1 - D, "hist", "saturation", "uniformity"}`` of ``cur`` against ``ref`` (module docstring)."""
    if ref.hist.shape != cur.hist.shape:
        raise ValueError(f"eval.guard.drift: histograms of shape {tuple(cur.hist.shape)} and {tuple(ref.hist.shape)} "
                         "(the channel count or the bins changed since the base samples)")
    hist = float(0.5 * (cur.hist - ref.hist).abs().sum(dim=1).mean())
    sat, uni = cur.saturation - ref.saturation, cur.uniformity - ref.uniformity
    return {"drift": 1.0 - max(hist, abs(sat), abs(uni)), "hist": hist, "saturation": sat, "uniformity": uni}
