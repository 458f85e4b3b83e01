"""Pictures people look at: the reward curve and sample grids with their prompts written underneath."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import torch


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _padded(values: list[float]) -> tuple[float, float]:
    """(lo, hi) of the finite ``values`` with 5% of their range (or of |hi|, at least 0.05) on each side."""
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    pad = 0.05 * (hi - lo) if hi > lo else max(0.05, 0.05 * abs(hi))
    return lo - pad, hi + pad


def reward_curve(rows: Sequence[dict], out: str | Path, title: str = "DigenRL demo") -> dict:
    """Train reward (step mean and its moving average), each reward part of a weighted sum (``reward/<name>``,
    when there are several) and eval reward (ODE) against step. The y-axis fits the curves (negative rewards,
    e.g. JPEG sizes or aesthetic deltas, stay visible). The reward-hacking guards (``guard/<name>``, eval.guard:
    scored on the eval samples, not optimised) are drawn against a second y-axis on the right, fitted to them.
    Returns ``{"ylim": (lo, hi), "labels": [...]}`` (``labels``: both axes' curves; ``guard_ylim`` with guards)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=120)
    values: list[float] = []
    steps = [r["step"] for r in rows if "reward_mean" in r]
    mean = [r["reward_mean"] for r in rows if "reward_mean" in r]
    if steps:
        ax.plot(steps, mean, color="tab:blue", alpha=0.35, lw=0.8, label="train reward per step (SDE samples)")
        k = max(1, len(mean) // 20)  # moving average over ~5% of the run
        smooth = [sum(mean[max(0, i - k + 1) : i + 1]) / len(mean[max(0, i - k + 1) : i + 1]) for i in range(len(mean))]
        ax.plot(steps, smooth, color="tab:blue", lw=1.8, label=f"train reward, moving mean of {k}")
        values += mean
    parts = sorted({k for r in rows for k in r if k.startswith("reward/") and k.count("/") == 1})
    if len(parts) > 1:  # one curve per reward of the weighted sum (a single part is the train reward itself)
        for name in parts:
            pts = [(r["step"], r[name]) for r in rows if isinstance(r.get(name), (int, float))]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=1.0, ls="--", label=name)
            values += [p[1] for p in pts]
    ev = [(r["step"], r["eval_reward"]) for r in rows if r.get("eval_reward") is not None]
    if ev:
        ax.plot([e[0] for e in ev], [e[1] for e in ev], "o-", color="tab:orange", label="eval reward (ODE, fixed prompts)")
        values += [e[1] for e in ev]
    ylim = _padded([float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)])
    ax.set_ylim(*ylim)
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=7)
    ax.set_title(title)
    result: dict = {"ylim": ylim}
    lines = list(ax.get_lines())
    guards = sorted({k for r in rows for k in r if k.startswith("guard/") and k.count("/") == 1})
    if guards:
        gx = ax.twinx()
        gvals: list[float] = []
        for i, name in enumerate(guards):
            pts = [(r["step"], r[name]) for r in rows if isinstance(r.get(name), (int, float))]
            gx.plot([p[0] for p in pts], [p[1] for p in pts], "s:", ms=3, lw=1.2, color=f"C{(i + 3) % 10}",
                    label=f"{name} (eval, not optimised)")
            gvals += [float(p[1]) for p in pts if math.isfinite(p[1])]
        result["guard_ylim"] = _padded(gvals)
        gx.set_ylim(*result["guard_ylim"])
        gx.set_ylabel("guard")
        lines += list(gx.get_lines())
        ax.legend(lines, [line.get_label() for line in lines], loc="best", fontsize=7)
    fig.tight_layout()
    fig.savefig(out)
    result["labels"] = [line.get_label() for line in lines]
    plt.close(fig)
    return result


def sample_grid(images: torch.Tensor, captions: Sequence[str], out: str | Path, *, title: str = "", scores: Sequence[float] | None = None, cols: int = 4) -> None:
    """Grid of images ([N, C, H, W] in [0, 1]; video: first frame) with each caption (and score) underneath."""
    plt = pyplot()
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
