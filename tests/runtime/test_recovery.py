"""Worker recovery (I6): a Ray run whose generator or trainer dies, or stalls, mid-step restarts from the newest
checkpoint, replays the uncommitted work and ends with the parameters of an uninterrupted run."""

from __future__ import annotations

import json

import pytest

from runtime_helpers import make_cfg

BASE = ["runtime.mode=gap_tsp", "runtime.trainers=2", "steps=4", "runtime.checkpoint_every=1"]


@pytest.fixture(scope="module")
def uninterrupted(ray_local, tiny_model, tmp_path_factory):
    from safetensors.torch import load_file

    from digenrl.runtime.driver import run_training

    run = tmp_path_factory.mktemp("clean") / "run"
    summary = run_training(make_cfg(tiny_model, run, *BASE), ray=True)
    assert summary["restarts"] == 0
    return load_file(str(run / "checkpoint.safetensors"))


def _max_rel(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).norm() / b[k].norm().clamp_min(1e-12)) for k in a)


@pytest.mark.parametrize("hook", ["gen0@3:exit", "trn1@3:exit", "trn0@2", "gen0@3:stall"])
def test_run_survives_a_failed_worker(hook, ray_local, tiny_model, tmp_path, uninterrupted, monkeypatch):
    from safetensors.torch import load_file

    from digenrl.runtime.driver import run_training

    run = tmp_path / "run"
    extra = ["runtime.watchdog_s=20"] if hook.endswith("stall") else []
    monkeypatch.setenv("DIGENRL_TEST_HOOKS", f"inject_failure={hook}")
    summary = run_training(make_cfg(tiny_model, run, *BASE, *extra), ray=True)
    worker, step = hook.split(":")[0].split("@")
    assert summary["restarts"] == 1 and summary["version"] == 4 and summary["audit_violations"] == []
    rec = summary["recoveries"][0]
    # numbered from 1 (the progress line's): the failed step, replayed first from the checkpoint of the one before
    assert (rec["worker"], rec["step"], rec["replay_from_step"]) == (worker, int(step), int(step))
    # the record agrees with the trace: the lost work starts at the publish of the checkpointed version (the
    # first attempt's), the restart is the recovery span every worker shows, from the detection to the restart
    from digenrl.observe.trace import read_chrome_trace

    spans = read_chrome_trace(run / "trace.json")
    v = rec["replay_from_step"] - 1  # the checkpoint's version: the steps before the replayed one
    pub_end = max(sp.end for sp in spans if sp.kind == "publish" and sp.label == f"publish v{v}"
                  and sp.end <= rec["detected_s"] + 1e-6)
    assert rec["lost_from_s"] == pytest.approx(pub_end, abs=1e-5)
    recovery = [sp for sp in spans if sp.kind == "recovery"]
    assert sorted(sp.worker for sp in recovery) == sorted({sp.worker for sp in spans if sp.kind != "recovery"})
    for sp in recovery:
        assert sp.start == pytest.approx(rec["detected_s"], abs=1e-5)
        assert sp.duration == pytest.approx(rec["restart_s"], abs=1e-5)
    assert rec["lost_s"] == pytest.approx(rec["restart_s"] + rec["detected_s"] - rec["lost_from_s"], abs=1e-9)
    assert 0 < rec["restart_s"] < rec["lost_s"]
    if hook.endswith("stall"):
        assert "stalled" in rec["cause"]
    got = load_file(str(run / "checkpoint.safetensors"))
    assert _max_rel(got, uninterrupted) <= 1e-6, hook  # the replay reproduces the lost work
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward_mean" in r] == [1, 2, 3, 4]  # each step logged once
    trace = json.loads((run / "trace.json").read_text())
    assert any(e.get("name") == "recovery" for e in trace["traceEvents"])
    assert not (run / "failure.json").exists()


def test_restarts_are_bounded(ray_local, tiny_model, tmp_path, monkeypatch):
    from digenrl.runtime import WorkerFailure
    from digenrl.runtime.driver import run_training

    run = tmp_path / "run"
    with pytest.raises(WorkerFailure, match="worker gen0 failed at step 3 "):
        monkeypatch.setenv("DIGENRL_TEST_HOOKS", "inject_failure=gen0@3:exit")
        run_training(make_cfg(tiny_model, run, *BASE, "runtime.max_restarts=0"), ray=True)
    rec = json.loads((run / "failure.json").read_text())
    assert (rec["worker"], rec["step"]) == ("gen0", 3) and rec["resume"].startswith("digenrl train --resume")
    assert sorted(p.name for p in (run / "checkpoints").iterdir())[-1] == "step_00000002.safetensors"


def test_ray_run_resumes_from_its_checkpoint(ray_local, tiny_model, tmp_path, uninterrupted):
    """A Ray run stopped after step 2 (its last checkpoint) and resumed ends as the uninterrupted run."""
    from safetensors.torch import load_file

    from digenrl.runtime.run_dir import run_start
    from digenrl.runtime.driver import run_training

    run = tmp_path / "run"
    first = make_cfg(tiny_model, run, *BASE[:2], "steps=2", "runtime.checkpoint_every=1")
    run_training(first, ray=True)
    cfg = make_cfg(tiny_model, run, *BASE)
    start = run_start(cfg, resume=True)
    assert start.kind == "resume" and start.step == 2
    summary = run_training(cfg, start, ray=True)
    assert summary["version"] == 4 and summary["audit_violations"] == []
    assert _max_rel(load_file(str(run / "checkpoint.safetensors")), uninterrupted) <= 1e-6
