"""One numbering of steps wherever a run shows them (``schedule.step_number``): the progress line, metrics.jsonl,
the failure line, failure.json, summary.json's recoveries and the test hook all count from 1, so the step whose
progress line says ``step 3/3`` is the step 3 a failure names. (The old code named a failure by the scheduler's
0-based index, one less, and read the hook's step the same way.) In-process runs of one colocated worker."""

from __future__ import annotations

import json

from digenrl.cli import main

BASE = ["steps=3", "train.prompts_per_step=2", "train.generations=4", "sampler.num_steps=4", "eval.num_prompts=4",
        "eval.every=0", "log.progress=false", "log.print_every=1", "runtime.checkpoint_every=1"]


def _step_lines(out: str) -> list[str]:
    return [x for x in out.splitlines() if x.startswith("step ")]


def test_a_failure_names_the_step_the_progress_line_would_show(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    monkeypatch.setenv("DIGENRL_TEST_HOOKS", "inject_failure=col0@3")  # the third step, "step 3/3"
    assert main(["train", f"run_dir={run}", *BASE, "runtime.max_restarts=0"]) == 1
    cap = capsys.readouterr()
    assert [x.split(" | ")[0] for x in _step_lines(cap.out)] == ["step 1/3", "step 2/3"]  # then step 3 failed
    assert "digenrl: run failed: worker col0 failed at step 3 during " in cap.err, cap.err
    assert "injected failure of col0 at step 3 " in cap.err, cap.err
    rec = json.loads((run / "failure.json").read_text())
    assert (rec["kind"], rec["worker"], rec["step"]) == ("worker", "col0", 3), rec
    assert rec["checkpoint"].endswith("step_00000002.safetensors")  # two steps done: --resume runs step 3
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward_mean" in r] == [1, 2]


def test_a_recovery_names_the_step_whose_line_shows_the_restart(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    monkeypatch.setenv("DIGENRL_TEST_HOOKS", "inject_failure=col0@2")
    assert main(["train", f"run_dir={run}", *BASE]) == 0
    lines = _step_lines(capsys.readouterr().out)
    assert [x.split(" | ")[0] for x in lines] == ["step 1/3", "step 2/3", "step 3/3"]  # each step once
    first = next(x for x in lines if "restarts 1" in x)  # the replayed step: the first line after the restart
    rec = json.loads((run / "summary.json").read_text())["recoveries"][0]
    assert first.startswith(f"step {rec['step']}/3 ") and rec["step"] == 2, (first, rec)
    assert rec["replay_from_step"] == 2  # replayed from the checkpoint of step 1
