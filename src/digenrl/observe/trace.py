"""Spans and the Chrome trace writer (open the JSON in https://ui.perfetto.dev or chrome://tracing).

A ``Span`` is one interval of one worker doing one kind of thing. ``sim`` produces them in virtual seconds,
``runtime`` in wall seconds; both write the same trace and the same Gantt chart (``observe.gantt``).

Trace layout: one process per pool (``Span.pool``, e.g. "generator" / "trainer"), one thread (row) per
worker, one complete event ("ph": "X") per span, times in microseconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

if TYPE_CHECKING:
    from digenrl.schedule.actions import Size


@dataclass(frozen=True)
class Span:
    worker: str
    kind: str      # generate, tag, train, commit, publish, switch, idle (others are allowed, drawn in grey)
    start: float   # seconds
    end: float     # seconds, >= start
    label: str = ""
    pool: str = ""
    size: Size | None = None  # an action's span: its size (``schedule.actions.Size``), what profiles read

    def __post_init__(self) -> None:
        if not self.end >= self.start:
            raise ValueError(f"span {self.worker}/{self.kind}: end {self.end} < start {self.start}")

    @property
    def duration(self) -> float:
        return self.end - self.start


def worker_order(spans: Iterable[Span], workers: Sequence[str] | None = None) -> list[str]:
    """Rows: ``workers`` if given, else workers in order of first appearance."""
    if workers is not None:
        return list(workers)
    seen: dict[str, None] = {}
    for s in spans:
        seen.setdefault(s.worker, None)
    return list(seen)


def chrome_trace(spans: Sequence[Span], workers: Sequence[str] | None = None) -> dict:
    """The trace as a JSON-serialisable dict."""
    rows = worker_order(spans, workers)
    pools: dict[str, int] = {}
    pool_of = {}
    for s in spans:
        pool_of.setdefault(s.worker, s.pool or "workers")
    for w in rows:
        pools.setdefault(pool_of.get(w, "workers"), len(pools))
    tid = {w: i for i, w in enumerate(rows)}
    events: list[dict] = []
    for name, pid in pools.items():
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
    for w in rows:
        pid = pools[pool_of.get(w, "workers")]
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid[w], "args": {"name": w}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid[w],
                       "args": {"sort_index": tid[w]}})
    for s in spans:
        if s.worker not in tid:
            continue
        events.append({"ph": "X", "name": s.kind, "cat": s.kind, "pid": pools[pool_of[s.worker]],
                       "tid": tid[s.worker], "ts": s.start * 1e6, "dur": s.duration * 1e6,
                       "args": {"label": s.label} | ({"generations": s.size.generations, "cells": s.size.cells}
                                                    if s.size is not None else {})})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(spans: Sequence[Span], path: str | Path, workers: Sequence[str] | None = None) -> Path:
    path = Path(path)
    path.write_text(json.dumps(chrome_trace(spans, workers)))
    return path


def read_chrome_trace(path: str | Path) -> list[Span]:
    """The spans of a trace ``write_chrome_trace`` wrote (its complete events; rows and pools by name; an action's
    size from its ``generations`` / ``cells`` args, so that ``control.observed`` profiles a trace file as it
    profiles a run's own spans)."""
    from digenrl.schedule.actions import Size

    events = json.loads(Path(path).read_text())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    pools = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    return [Span(names[e["tid"]], e["name"], e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6, e["args"].get("label", ""),
                 pools.get(e["pid"], ""),
                 Size(e["args"]["generations"], e["args"]["cells"]) if "generations" in e["args"] else None)
            for e in events if e.get("ph") == "X"]
