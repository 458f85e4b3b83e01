"""Runs that survive: a run SIGKILLed inside a step and resumed, or stopped by SIGINT / SIGTERM and resumed,
ends with parameters, optimizer state and EMA bitwise equal to an uninterrupted run of the same length (I6);
a second signal exits at once; a run directory holding a run is never silently reused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from digenrl.cli import main

HERE = Path(__file__).resolve().parent
TINY = ["train.prompts_per_step=2", "train.generations=4", "sampler.num_steps=4", "eval.num_prompts=4",
        "eval.grid_prompts=2", "eval.every=2", "log.progress=false", "train.ema_decay=0.9",
        "runtime.checkpoint_every=2", "runtime.keep_checkpoints=2"]
STEPS = 5


def cli(*args, fault: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(HERE / "fault_run.py"), fault] if fault else [sys.executable, "-m", "digenrl.cli"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=300)


def tensors(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def assert_bitwise_equal(a: Path, b: Path) -> None:
    ta, tb = tensors(a), tensors(b)
    assert ta.keys() == tb.keys()
    for k in ta:
        assert ta[k].dtype == tb[k].dtype and ta[k].shape == tb[k].shape, k
        assert ta[k].numpy().tobytes() == tb[k].numpy().tobytes(), k


def step_rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run of STEPS steps."""
    run = tmp_path_factory.mktemp("ref") / "run"
    assert main(["train", f"run_dir={run}", f"steps={STEPS}", *TINY]) == 0
    return run


def check_same_as_reference(run: Path, reference: Path) -> None:
    last = f"checkpoints/step_{STEPS:08d}.safetensors"
    keys = tensors(run / last).keys()
    assert any(k.startswith("optim/") for k in keys) and any(k.startswith("ema/") for k in keys)
    assert_bitwise_equal(run / last, reference / last)                      # weights, AdamW moments, EMA, RNG
    assert_bitwise_equal(run / "checkpoint.safetensors", reference / "checkpoint.safetensors")  # final weights
    rows, ref = step_rows(run), step_rows(reference)
    assert [r["step"] for r in rows] == [r["step"] for r in ref]             # each step exactly once
    assert [r.get("reward_mean") for r in rows] == [r.get("reward_mean") for r in ref]
    assert not (run / "failure.json").exists()
    assert json.loads((run / "summary.json").read_text())["steps"] == STEPS


def test_sigkill_inside_a_step_then_resume_is_bitwise_exact(tmp_path, reference):
    run = tmp_path / "run"
    proc = cli("train", f"run_dir={run}", f"steps={STEPS}", *TINY, fault="KILL@3")
    assert proc.returncode == -9, proc.stderr[-2000:]
    # killed while step 3 trained: steps 1-3 committed, the checkpoint of step 2 is the newest
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000002.safetensors"]
    assert max(r["step"] for r in step_rows(run)) == 3
    assert main(["train", "--resume", str(run)]) == 0
    check_same_as_reference(run, reference)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step_00000004.safetensors", "step_00000005.safetensors"]           # keep_checkpoints=2


# one handler serves both signals: SIGINT here, SIGTERM twice below (and on a Ray run in tests/runtime)
@pytest.mark.parametrize("sig,code", [("INT", "SIGINT")])
def test_signal_stops_after_the_step_with_a_checkpoint_then_resume(tmp_path, reference, sig, code):
    run = tmp_path / "run"
    proc = cli("train", f"run_dir={run}", f"steps={STEPS}", *TINY, fault=f"{sig}@2")
    assert proc.returncode == 75, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last == f"digenrl: stopped by {code}; resume with: digenrl train --resume {run}"
    assert "Traceback" not in proc.stderr
    failure = json.loads((run / "failure.json").read_text())
    assert failure["signal"] == code and failure["step"] == 3           # step 2 (0-based) was finished
    assert (run / "checkpoints" / "step_00000003.safetensors").is_file()
    assert not (run / "summary.json").exists()
    assert main(["train", "--resume", str(run)]) == 0
    check_same_as_reference(run, reference)


def test_second_signal_exits_at_once(tmp_path):
    run = tmp_path / "run"
    proc = cli("train", f"run_dir={run}", f"steps={STEPS}", *TINY, fault="TERM@2x2")
    assert proc.returncode == 128 + 15, proc.stderr[-2000:]
    assert "second SIGTERM" in proc.stderr
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["step_00000002.safetensors"]                      # nothing written after the signal
    assert not (run / "failure.json").exists()


def test_rerun_into_a_run_dir_is_refused_then_overwrite_replaces_it(tmp_path, capsys):
    run = tmp_path / "run"
    args = ["train", f"run_dir={run}", "steps=1", *TINY]
    assert main(args) == 0
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--resume" in err
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before  # nothing changed
    (run / "failure.json").write_text("{}")                                 # a stale record of the old run
    (run / "logs").mkdir()
    (run / "logs" / "gen0.log").write_text("")                              # an output an in-process run does not write
    assert main([*args, "--overwrite"]) == 0
    assert not (run / "failure.json").exists() and not (run / "logs").exists()
    assert [r["step"] for r in step_rows(run)] == [0, 1, 1]


def test_resume_refuses_a_math_change_and_an_empty_dir(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", "steps=2", *TINY]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "train.lr=0.1"]) == 2
    assert "train.lr" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path / "nothing")]) == 2
    assert "no run" in capsys.readouterr().err
    assert main(["train", "--resume", str(run), "steps=1"]) == 2
    assert "steps: 1 is below the 2 steps" in capsys.readouterr().err
    assert not (tmp_path / "nothing").exists()
    assert main(["train", "--resume", str(run), "--overwrite"]) == 2
    assert "--resume and --overwrite exclude each other" in capsys.readouterr().err
    import shutil

    from safetensors.torch import save_file

    other = tmp_path / "other"  # a copy whose latest checkpoint is weights without the resume metadata
    shutil.copytree(run, other)
    save_file({"w": __import__("torch").zeros(1)}, str(other / "checkpoints" / "step_00000002.safetensors"))
    assert main(["train", "--resume", str(other)]) == 2
    err = capsys.readouterr().err  # the one line says why the checkpoint there does not count
    assert "holds no resumable checkpoint (checkpoints/step_*.safetensors); the newest, step_00000002.safetensors, " \
           "does not verify: " in err
    assert "is not a resumable checkpoint (no digenrl_train_state metadata)" in err
    # steps and logging may change: the run goes on from its last checkpoint
    assert main(["train", "--resume", str(run), "steps=3", "log.progress=false"]) == 0
    assert [r["step"] for r in step_rows(run) if "reward_mean" in r] == [1, 2, 3]


def test_resume_auto_starts_fresh_then_continues(tmp_path):
    run = tmp_path / "run"
    args = ["train", f"run_dir={run}", "resume=auto", *TINY]
    assert main([*args, "steps=2"]) == 0
    assert main([*args, "steps=4"]) == 0                                    # continues from step 2
    assert [r["step"] for r in step_rows(run) if "reward_mean" in r] == [1, 2, 3, 4]


def test_resume_auto_never_replaces_a_finished_run_without_checkpoints(tmp_path, capsys):
    run = tmp_path / "run"
    args = ["train", f"run_dir={run}", "resume=auto", *TINY, "runtime.checkpoint_every=0", "steps=1"]
    assert main(args) == 0
    summary = (run / "summary.json").read_text()
    assert main(args) == 2 and "finished run" in capsys.readouterr().err
    assert (run / "summary.json").read_text() == summary
    assert main(["train", "--resume", str(run)]) == 2  # --resume itself: the same run, but nothing to resume from
    assert "holds no resumable checkpoint" in capsys.readouterr().err
    assert (run / "summary.json").read_text() == summary
