"""A run of one colocated worker in this process (``runtime.local``) has the Ray runtime's recovery: a worker that
raises ends the attempt, the run replays from its newest checkpoint and ends bitwise where an uninterrupted run
does (I6), with the restart in summary.json and every step's row once more from the replayed step. A test hook
that would end or stop the process itself is refused before anything is written."""

from __future__ import annotations

import json

import pytest

from digenrl.cli import main

BASE = ["steps=3", "train.prompts_per_step=2", "train.generations=4", "sampler.num_steps=4", "eval.num_prompts=4",
        "eval.every=0", "log.progress=false", "runtime.checkpoint_every=1", "train.ema_decay=null"]


def test_a_raising_worker_is_recovered_in_process(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    assert main(["train", f"run_dir={tmp_path / 'a'}", *BASE]) == 0
    monkeypatch.setenv("DIGENRL_TEST_HOOKS", "inject_failure=col0@3")
    assert main(["train", f"run_dir={tmp_path / 'b'}", *BASE]) == 0
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["transport"] == "in-process" and summary["restarts"] == 1 and summary["audit_violations"] == []
    rec = summary["recoveries"][0]  # steps from 1: step 3 failed, replayed from the checkpoint of step 2
    assert (rec["worker"], rec["step"], rec["replay_from_step"]) == ("col0", 3, 3)
    a, b = load_file(str(tmp_path / "a" / "checkpoint.safetensors")), load_file(str(tmp_path / "b" / "checkpoint.safetensors"))
    assert all(bool((a[k] == b[k]).all()) for k in a)  # bitwise: the replay computed the same step


@pytest.mark.parametrize("kind", ["exit", "stall"])
def test_a_hook_that_ends_the_process_is_refused_in_process(tmp_path, capsys, kind, monkeypatch):
    run = tmp_path / "run"
    monkeypatch.setenv("DIGENRL_TEST_HOOKS", f"inject_failure=col0@1:{kind}")
    assert main(["train", f"run_dir={run}", *BASE]) == 2
    assert "DIGENRL_TEST_HOOKS: inject_failure" in capsys.readouterr().err and not run.exists()


def test_calibration_in_process_times_every_op(tmp_path, monkeypatch):
    """The calibration's per-op calls (``calibrate._Stream``: ``calibration_start``, one ``calibration_run`` per
    timed execution, ``calibration_end``) go through the in-process transport too: ``runtime.calibration.when=always``
    writes a profile with a time for every op, and a failure in the calibration (the ``calibrate`` phase of the
    test hook) is recovered like one in a step."""
    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", *BASE, "runtime.calibration.when=always",
                 "tuning.calibration_repeats=1"]) == 0
    ops = json.loads((run / "profile.json").read_text())["ops"]
    for op in ("trainer/denoise", "trainer/vae_decode", "trainer/reward", "train_chunk", "optimizer", "publish"):
        assert ops[op] and all(t > 0 for _, t in ops[op]), (op, ops[op])
    other = tmp_path / "hooked"
    monkeypatch.setenv("DIGENRL_TEST_HOOKS", "inject_failure=col0@calibrate")
    assert main(["train", f"run_dir={other}", *BASE, "runtime.calibration.when=always",
                 "tuning.calibration_repeats=1"]) == 0
    summary = json.loads((other / "summary.json").read_text())
    assert summary["restarts"] == 1 and summary["recoveries"][0]["action"] == "profiling", summary["recoveries"]
