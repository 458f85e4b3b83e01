"""Gantt chart of spans: one row per worker, one colour per kind, with a legend (PNG via matplotlib Agg)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .trace import Span, worker_order

COLORS = {
    "generate": "#4C72B0",  # blue
    "tag": "#DD8452",       # orange: trainer-assisted generation
    "train": "#55A868",     # green
    "commit": "#C44E52",    # red
    "publish": "#8172B3",   # purple
    "switch": "#937860",    # brown
    "idle": "#EEEEEE",      # light grey
}
OTHER = "#999999"


def plot_gantt(spans: Sequence[Span], path: str | Path, title: str = "", workers: Sequence[str] | None = None) -> Path:
    """Write a Gantt PNG of ``spans`` to ``path`` and return the path."""
    from matplotlib.patches import Patch

    from .plots import pyplot

    plt = pyplot()

    rows = worker_order(spans, workers)
    index = {w: i for i, w in enumerate(rows)}
    by_kind: dict[str, dict[int, list[tuple[float, float]]]] = {}
    for s in spans:
        if s.worker in index and s.duration > 0:
            by_kind.setdefault(s.kind, {}).setdefault(index[s.worker], []).append((s.start, s.duration))
    height = max(2.0, 0.28 * len(rows) + 1.2)
    fig, ax = plt.subplots(figsize=(12, height))
    kinds = [k for k in COLORS if k in by_kind] + sorted(k for k in by_kind if k not in COLORS)
    for kind in kinds:
        color = COLORS.get(kind, OTHER)
        for row, bars in by_kind[kind].items():
            ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=color, edgecolor="white", linewidth=0.3)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows, fontsize=7 if len(rows) > 20 else 9)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel("time (s)")
    if spans:
        ax.set_xlim(min(s.start for s in spans), max(s.end for s in spans))
    ax.set_title(title)
    ax.legend(handles=[Patch(color=COLORS.get(k, OTHER), label=k) for k in kinds], loc="upper left",
              bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    path = Path(path)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
