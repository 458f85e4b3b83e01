"""JPEG compressibility / incompressibility rewards (DDPO, Black et al. 2023, "Training Diffusion Models with
Reinforcement Learning", section 6.1 and its reference code ``ddpo_pytorch/rewards.py``).

Each image is quantised to 8-bit RGB and JPEG-encoded with PIL at quality 95; its size in kilobytes is
``bytes / 1000``. Then, by default as Flow-GRPO (``flow_grpo/rewards.py``)::

    jpeg_compressibility   r = -size_kb / 500      (scale="flow_grpo", the default)
                           r = -size_kb            (scale="ddpo": DDPO's reference code)
    jpeg_incompressibility r = +size_kb            (both projects)

Flow-GRPO's recipes are tuned with the /500 factor (a 512x512 image of ~50 kB scores -0.1).

Videos ``[B, C, F, H, W]`` score the mean over frames. Grayscale images are replicated to RGB.
"""

from __future__ import annotations

import io
from typing import Literal, Sequence

import torch

from digenrl.rewards.base import rgb_frames

QUALITY = 95
COMPRESSIBILITY_SCALES = {"flow_grpo": 1.0 / 500.0, "ddpo": 1.0}


def jpeg_size_kb(images: torch.Tensor, quality: int = QUALITY) -> torch.Tensor:
    """JPEG size in kB (bytes / 1000) of every sample (mean over frames for videos)."""
    from PIL import Image

    def kb(frame) -> float:
        buf = io.BytesIO()
        Image.fromarray(frame).save(buf, format="JPEG", quality=quality)
        return buf.tell() / 1000.0

    sizes = [sum(map(kb, frames)) / len(frames) for frames in rgb_frames(images, "jpeg reward")]
    return torch.tensor(sizes, dtype=torch.float32)


class JpegReward:
    def __init__(self, sign: float, name: str, quality: int = QUALITY):
        self.sign, self.name, self.quality = sign, name, int(quality)

    def __call__(self, images: torch.Tensor, prompts: Sequence) -> torch.Tensor:
        return self.sign * jpeg_size_kb(images, self.quality)


def build_jpeg_compressibility(quality: int = QUALITY, scale: Literal["flow_grpo", "ddpo"] = "flow_grpo") -> JpegReward:
    return JpegReward(-COMPRESSIBILITY_SCALES[scale], "jpeg_compressibility", quality)


def build_jpeg_incompressibility(quality: int = QUALITY) -> JpegReward:
    return JpegReward(1.0, "jpeg_incompressibility", quality)
