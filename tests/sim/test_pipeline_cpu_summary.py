"""The CPU pipeline benchmark's README paragraph: full's speedup over naive split into its two measured factors."""

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
