"""benchmarks/gpu_acceptance.sh --tiny on the CPU: the script a lent GPU runs is ready and its stages work.

The calibration and memory stages are left out here (STAGES): tests/models/test_gpu_calibrate.py and
test_gpu_memory_bench.py run those benchmarks with --tiny already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_acceptance_script_runs_its_stages_on_cpu(tmp_path):
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, OUT=str(tmp_path / "acc"), STAGES="gpu_tests,train,simulate", PYTHON=sys.executable,
               DIGENRL=str(bin_dir / "digenrl"), OMP_NUM_THREADS="1")
    p = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_acceptance.sh"), "--tiny"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=540)
    assert p.returncode == 0, p.stderr[-3000:]
    stages = json.loads((tmp_path / "acc" / "acceptance.json").read_text())
    assert [s["stage"] for s in stages] == ["gpu_tests", "train", "simulate"]
    assert all(s["rc"] == 0 for s in stages)
    assert "audit clean, version 3" in p.stdout
    rows = json.loads((tmp_path / "acc" / "simulate.json").read_text())
    assert {r["mode"] for r in rows} == {"gap_tsp", "gap_tsp_tag"}
    assert (tmp_path / "acc" / "run" / "profile_observed.json").exists()


def test_a_failing_stage_fails_the_script_and_is_recorded(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path / "acc"), STAGES="simulate", PYTHON=sys.executable,
               DIGENRL=str(Path(sys.executable).parent / "digenrl"))
    p = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_acceptance.sh"), "--tiny"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0  # no run to simulate: the stage fails, and so does the script
    stages = json.loads((tmp_path / "acc" / "acceptance.json").read_text())
    assert stages == [{"stage": "simulate", "rc": stages[0]["rc"], "seconds": stages[0]["seconds"]}]
    assert stages[0]["rc"] != 0
