"""Pictures people look at: the reward curve and sample grids with their prompts written underneath."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def reward_curve(rows: Sequence[dict], out: str | Path, title: str = "DigenRL demo") -> None:
    """Train reward (step mean and its moving average) and eval reward (ODE) against step."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=120)
    steps = [r["step"] for r in rows if "reward_mean" in r]
    mean = [r["reward_mean"] for r in rows if "reward_mean" in r]
    if steps:
        ax.plot(steps, mean, color="tab:blue", alpha=0.35, lw=0.8, label="train reward per step (SDE samples)")
        k = max(1, len(mean) // 20)  # moving average over ~5% of the run
        smooth = [sum(mean[max(0, i - k + 1) : i + 1]) / len(mean[max(0, i - k + 1) : i + 1]) for i in range(len(mean))]
        ax.plot(steps, smooth, color="tab:blue", lw=1.8, label=f"train reward, moving mean of {k}")
    ev = [(r["step"], r["eval_reward"]) for r in rows if r.get("eval_reward") is not None]
    if ev:
        ax.plot([e[0] for e in ev], [e[1] for e in ev], "o-", color="tab:orange", label="eval reward (ODE, fixed prompts)")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def sample_grid(images: torch.Tensor, captions: Sequence[str], out: str | Path, *, title: str = "", scores: Sequence[float] | None = None, cols: int = 4) -> None:
    """Grid of images ([N, C, H, W] in [0, 1]; video: first frame) with each caption (and score) underneath."""
    plt = _plt()
    imgs = images.detach().float().cpu()
    if imgs.ndim == 5:
        imgs = imgs[:, :, 0]
    n = imgs.shape[0]
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 2.2, rows * 1.75 + 0.4), dpi=120, squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i >= n:
            continue
        img = imgs[i]
        if img.shape[0] == 1:
            ax.imshow(img[0].numpy(), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
        else:
            ax.imshow(img[:3].permute(1, 2, 0).clamp(0, 1).numpy())
        label = captions[i] if scores is None else f"{captions[i]}\nr={scores[i]:.2f}"
        ax.set_title(label, fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
