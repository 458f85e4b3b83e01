"""The CPU benchmarks' text (docs/benchmarks.md): full's speedup over naive split into its two measured factors
(``pipeline_cpu.py``); the publish paths' held times (``publish_cpu.py``)."""

from __future__ import annotations

import re

from script_loader import load_script


def _row(mode: str, step: float, eff: float, naive_step: float) -> dict:
    return {"mode": mode, "step_time_s": step, "efficiency": eff, "speedup_vs_naive": naive_step / step,
            "sim_step_time_s": step, "sim_error": 0.0}


def test_work_split_factors_multiply_to_the_measured_speedup():
    bench = load_script("benchmarks/pipeline_cpu.py")
    assert bench.workers("naive") == bench.workers("full") == bench.workers("colocated") == 2
    # naive: 2 workers x 0.5 x 8 s = 8 busy worker-seconds; full: 2 x 0.9 x 4 s = 7.2 (cheaper ops in full)
    rows = [_row("colocated", 5.0, 0.88, 8.0), _row("naive", 8.0, 0.5, 8.0), _row("full", 4.0, 0.9, 8.0)]
    text = " ".join(bench.work_split(rows))
    assert "0.900 over 0.500 (1.80x" in text
    assert "8.00 s of naive over 7.20 s of full (1.11x" in text
    assert "together 2.00x" in text  # 1.80 x 1.11 = 8 / 4, the measured speedup
    assert "spent 8.80 busy worker-seconds per step (+10% over naive)" in text  # 2 x 0.88 x 5
    factors = [float(x) for x in re.findall(r"\((\d\.\d\d)x", text)]
    assert abs(factors[0] * factors[1] - 2.0) < 0.01
    assert bench.work_split([_row("naive", 8.0, 0.5, 8.0)]) == []  # nothing to split without full
    assert "load average" not in bench.summary(rows)  # a results file from before the field says none
    for r, loads in zip(rows, ([0.2, 1.4], [0.3], [0.9])):
        r["round_load_avg_1m_before"] = loads
    assert "The 1-min load average before each run was 0.2-1.4." in bench.summary(rows)


def test_publish_held_time_counts_only_the_pool_kind_and_window():
    from digenrl.observe.trace import Span

    bench = load_script("benchmarks/publish_cpu.py")
    t, g = "trainer", "generator"
    spans = [Span("trn0", "publish", 0.9, 1.1, "", t), Span("shard0", "publish", 3.0, 3.2, "", t),
             Span("trn0", "train", 1.2, 2.0, "", t), Span("gen0", "publish", 2.0, 2.5, "", g),
             Span("trn0", "publish", 5.0, 5.5, "", t)]
    # window [1, 4] over 2 steps: 0.1 s of the first span (clipped) + 0.2 s = 0.3 s -> 0.15 s per step (a shard
    # group's row counts: the pool, not the worker's name, says whose the span is)
    assert abs(bench.held_per_step(spans, "publish", t, 1.0, 4.0, 2) - 0.15) < 1e-12
    assert abs(bench.held_per_step(spans, "publish", g, 1.0, 4.0, 2) - 0.25) < 1e-12
    assert bench.held_per_step(spans, "commit", t, 1.0, 4.0, 2) == 0.0
    # one publish per version, however many spans it has (a stream: the sender ends before the generator)
    stream = [Span("trn0", "publish", 1.0, 1.01, "publish v1"), Span("gen0", "publish", 1.0, 1.1, "publish v1"),
              Span("trn0", "publish", 5.0, 5.01, "publish v2"), Span("gen0", "publish", 5.0, 5.2, "publish v2")]
    assert bench.publish_ends(stream) == [1.1, 5.2]


def test_publish_table_reads_its_numbers_from_the_results():
    bench = load_script("benchmarks/publish_cpu.py")

    def row(path, step, trn, gen, per):
        return {"publish": path, "step_time_s": step, "efficiency": 0.9, "trainer_publish_s": trn,
                "generator_publish_s": gen, "trainer_commit_s": 0.04, "round_step_times_s": per, "rounds": 2,
                "state_bytes": 3 * 2**20}
    rows = [row("object_store", 4.0, 0.05, 0.0, [3.8, 4.2]), row("stream", 3.8, 0.002, 0.03, [3.6, 4.0])]
    text = bench.markdown(rows)
    assert "| `object_store` | 4.000 | 3.80 / 4.20 | 0.90 | 50.0 | 0.0 | 40.0 |" in text
    assert "Weights of 3.0 MiB, mean of 2 interleaved runs per path." in text  # no load field: none said
    rows[0]["round_load_avg_1m_before"], rows[1]["round_load_avg_1m_before"] = [0.4, 1.2], [0.9, 0.7]
    assert "per path (1-min load average 0.4-1.2 before each run)." in bench.markdown(rows)
    assert "holds the trainer 2.0 ms per step against the object store's 50.0 ms" in text
    assert "-5.0% against the object store's" in text and "spread by 11%" in text
