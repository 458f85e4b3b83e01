"""Spans, Chrome trace and Gantt outputs (shared by sim and runtime)."""

from __future__ import annotations

import json

import pytest

from digenrl.observe.gantt import plot_gantt
from digenrl.observe.trace import Span, chrome_trace, read_chrome_trace, write_chrome_trace


def spans():
    return [Span("g0", "generate", 0.0, 1.5, "s0 g0", "generator"), Span("t0", "idle", 0.0, 1.5, "", "trainer"),
            Span("t0", "train", 1.5, 2.0, "s0 g0 4 cells", "trainer"), Span("t0", "tag", 2.0, 2.5, "", "trainer")]


def test_chrome_trace_has_one_row_per_worker_and_microseconds(tmp_path):
    data = json.loads(write_chrome_trace(spans(), tmp_path / "t.json").read_text())
    rows = {(e["pid"], e["tid"]): e["args"]["name"] for e in data["traceEvents"] if e["name"] == "thread_name"}
    assert sorted(rows.values()) == ["g0", "t0"]
    train = next(e for e in data["traceEvents"] if e["name"] == "train")
    assert (train["ts"], train["dur"]) == (1.5e6, 0.5e6)
    assert rows[(train["pid"], train["tid"])] == "t0"
    procs = {e["args"]["name"] for e in data["traceEvents"] if e["name"] == "process_name"}
    assert procs == {"generator", "trainer"}


def test_read_chrome_trace_gives_back_the_spans_written(tmp_path):
    got = read_chrome_trace(write_chrome_trace(spans(), tmp_path / "t.json"))
    assert [(s.worker, s.kind, s.label, s.pool) for s in got] == [(s.worker, s.kind, s.label, s.pool) for s in spans()]
    assert [t for s in got for t in (s.start, s.end)] == pytest.approx([t for s in spans() for t in (s.start, s.end)])


def test_worker_order_is_respected():
    tr = chrome_trace(spans(), workers=["t0", "g0"])
    tids = {e["args"]["name"]: e["tid"] for e in tr["traceEvents"] if e["name"] == "thread_name"}
    assert tids == {"t0": 0, "g0": 1}


def test_gantt_png(tmp_path):
    out = plot_gantt(spans(), tmp_path / "g.png", "test")
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_span_validation():
    with pytest.raises(ValueError, match="end"):
        Span("w", "train", 2.0, 1.0)
