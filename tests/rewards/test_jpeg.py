"""JPEG compressibility rewards against direct PIL encoding, and composition through the registry."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from digenrl.rewards.registry import build_reward, build_weighted
from digenrl.rollout.records import Prompt


def images(n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    flat = torch.full((1, 3, 32, 32), 0.5)
    noise = torch.rand(n - 1, 3, 32, 32, generator=g)
    return torch.cat([flat, noise])


def direct_kb(img: torch.Tensor) -> float:
    arr = (img.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=95)
    return len(buf.getvalue()) / 1000.0


def test_compressibility_is_minus_jpeg_kilobytes():
    x = images()
    prompts = [Prompt(i, "p") for i in range(3)]
    comp = build_reward("jpeg_compressibility")(x, prompts)
    ddpo = build_reward("jpeg_compressibility", scale="ddpo")(x, prompts)
    incomp = build_reward("jpeg_incompressibility")(x, prompts)
    expected = torch.tensor([direct_kb(im) for im in x])
    torch.testing.assert_close(comp, -expected / 500)  # flow_grpo/rewards.py: -kB / 500
    torch.testing.assert_close(ddpo, -expected)  # DDPO: -kB
    torch.testing.assert_close(incomp, expected)
    assert comp[0] > comp[1]  # a flat image compresses better than noise


def test_weighted_sum_through_registry_and_video_mean():
    x = images()
    prompts = [Prompt(i, "p") for i in range(3)]
    ws = build_weighted({"jpeg_compressibility": {"weight": 2.0}, "jpeg_incompressibility": {"weight": 0.5}})
    total, parts = ws.score(x, prompts)
    torch.testing.assert_close(total, (0.5 - 2.0 / 500) * parts["jpeg_incompressibility"])
    video = torch.stack([x[0], x[1]], dim=1).unsqueeze(0)  # [1, C, F=2, H, W]
    r = build_reward("jpeg_incompressibility")(video, prompts[:1])
    torch.testing.assert_close(r, torch.tensor([(direct_kb(x[0]) + direct_kb(x[1])) / 2]))
    with pytest.raises(ValueError, match="expected images"):
        build_reward("jpeg_compressibility")(torch.rand(3, 4, 4), prompts)
    gray = build_reward("jpeg_incompressibility")(x[:1, :1], prompts[:1])
    assert gray.shape == (1,) and np.isfinite(gray.item())
