"""benchmarks/gpu_step.py --tiny on the CPU: the device check of the simulator against DigenRL's own step runs, and
what it records hangs together (the prediction is the simulator's on the run's own calibration; the pool's speedups
are the predicted steps' ratios). Its numbers are not checked here: they are timings of a tiny model."""

from __future__ import annotations

import json

import pytest

from script_loader import load_script


def test_tiny_dry_run_records_the_measured_step_against_the_simulator(tmp_path):
    pytest.importorskip("diffusers")
    mod = load_script("benchmarks/gpu_step.py")
    # a compiled copy that fails (here: a value the config refuses) is recorded, and the pool priced merged only
    mod.FAST = ["generator.merge_lora=true", "generator.compile=bogus"]
    rc = mod.main(["--tiny", "--compile", "--steps", "3", "--repeats", "1", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "step.json").read_text())
    assert rc == 0, {k: v.get("error") for k, v in report["stages"].items()}
    co, pool = report["stages"]["colocated"]["result"], report["stages"]["pool"]["result"]
    assert set(co) == set(mod.WORKLOADS) and pool["generator"] == ["generator.merge_lora=true"]
    assert "bogus" in pool["compile_error"]
    for name, row in co.items():
        assert row["step_time_s"] > 0 and row["audit_violations"] == 0
        assert row["error_calibration"] == pytest.approx(row["sim_step_time_s"] / row["step_time_s"] - 1)
        prof = row["profile"]
        assert prof["format"] == "digenrl-profile" and (prof["generators"], prof["trainers"]) == (0, 1)
        steps = pool[name]["predicted_step_s"]
        assert set(steps) == {"colocated_2", "gap_tsp_tag_fast_1_1", "full_fast_1_1"}
        assert pool[name]["speedup_vs_colocated"]["full_fast_1_1"] == pytest.approx(
            steps["colocated_2"] / steps["full_fast_1_1"])
        prof = pool[name]["profile"]  # one generator and one trainer rank, calibrated here
        assert (prof["generators"], prof["trainers"]) == (1, 1)
    assert report["workloads"]["base"][0] == "model.kind=flux"  # the temporary model paths are not recorded
    line = mod.summary(report).splitlines()[1]
    assert f"measured {co['flow_grpo']['step_time_s']:.3f} s" in line and "predicted on two such devices" in line


def test_bad_arguments_exit_2_before_anything_runs(tmp_path, capsys):
    mod = load_script("benchmarks/gpu_step.py")
    assert mod.main(["--stages", "colocated,bogus", "--out", str(tmp_path / "a")]) == 2
    assert mod.main(["--stages", "pool", "--out", str(tmp_path / "b")]) == 2
    assert mod.main(["--steps", "2", "--out", str(tmp_path / "c")]) == 2
    assert "bogus" in capsys.readouterr().err and not (tmp_path / "a").exists()
