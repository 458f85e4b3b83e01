"""A stalled worker is noticed within a bounded multiple of ``runtime.watchdog_s`` in every phase of a Ray run
(issue 40; ``runtime.deadlines``): start-up (30 w), the calibration (2 w per call, whatever its size), a step's
actions (w: tests/runtime/test_recovery.py, test_deadlines.py), an eval and a checkpoint (10 w). The worker stops
itself with SIGSTOP (the test hook ``DIGENRL_TEST_HOOKS=inject_failure=<worker>@<phase>:stall``); the run recovers, or (start-up) stops
with an error naming it. Small watchdogs (and, where the phase's factor would make the test long, a smaller
factor) keep the tests short: what they check is the bound, a multiple of w."""

from __future__ import annotations

import json
import math
import re
import threading
import time

import pytest

from runtime_helpers import make_cfg

BASE = ["runtime.mode=gap_tsp", "runtime.trainers=2", "steps=2"]
SLACK_S = 30.0  # a loaded 2-core machine: round trips, the pools' own start


def _wake_stopped_children() -> None:
    """SIGCONT this process's stopped descendants (Ray's workers): ends a hang of a broken deadline."""
    import signal

    import psutil

    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_STOPPED:
                p.send_signal(signal.SIGCONT)
        except psutil.Error:
            pass


def _run(cfg, limit_s: float):
    """(summary or the error raised, seconds) of ``run_training(cfg, ray=True)``, given up (and the stopped workers
    woken) after ``limit_s``: a missing deadline fails the test instead of hanging it."""
    from digenrl.runtime.driver import run_training

    out: dict = {}

    def go():
        try:
            out["summary"] = run_training(cfg, ray=True)
        except BaseException as e:  # noqa: BLE001 -- returned to the test's thread
            out["error"] = e

    t0 = time.monotonic()
    th = threading.Thread(target=go, daemon=True)
    th.start()
    th.join(limit_s)
    hung = th.is_alive()
    if hung:
        _wake_stopped_children()
        th.join(120)
    assert not hung, f"the stalled worker was not noticed in {limit_s:.0f} s"
    return out.get("summary", out.get("error")), time.monotonic() - t0


def test_a_worker_stalled_at_startup_is_named(ray_local, tiny_model, tmp_path, monkeypatch):
    from digenrl.runtime import deadlines as dl
    from digenrl.runtime.errors import WorkerFailure

    w = 2.0
    monkeypatch.setattr(dl, "STARTUP_FACTOR", 10.0)  # 20 s instead of 60 s: the bound is a multiple of w either way
    run = tmp_path / "run"
    cfg = make_cfg(tiny_model, run, *BASE, f"runtime.watchdog_s={w}")
    monkeypatch.setenv("DIGENRL_TEST_HOOKS", "inject_failure=gen0@startup:stall")
    err, took = _run(cfg, 10 * w + 180)
    assert isinstance(err, WorkerFailure) and err.worker == "gen0" and "stalled" in str(err), err
    assert f"no answer within {10 * w:g} s" in str(err)
    rec = json.loads((run / "failure.json").read_text())
    assert rec["worker"] == "gen0" and "stalled" in rec["error"]


def test_a_generator_stalled_in_calibration_is_noticed_within_the_bound(ray_local, tiny_model, tmp_path, monkeypatch):
    """The issue's case (gap_tsp_tag calibrates before step 1): with runtime.watchdog_s = 20 the stall must be
    noticed within 90 s (4.5 w); here w = 8, bound 4.5 w = 36 s, and the run recovers."""
    from digenrl.runtime.deadlines import CALIBRATION_FACTOR

    w = 8.0
    cfg = make_cfg(tiny_model, tmp_path / "run", "runtime.mode=gap_tsp_tag", "runtime.trainers=2", "steps=2",
                   f"runtime.watchdog_s={w}")
    monkeypatch.setenv("DIGENRL_TEST_HOOKS", "inject_failure=gen0@calibrate:stall")
    summary, _ = _run(cfg, 600)
    assert isinstance(summary, dict), summary
    assert summary["version"] == 2 and summary["audit_violations"] == []
    rec = summary["recoveries"][0]
    assert rec["worker"] == "gen0" and "stalled" in rec["cause"] and f"{CALIBRATION_FACTOR * w:g} s" in rec["cause"]
    # the run's clock starts just before the calibration: detected_s is the time from the stall to its notice
    assert rec["detected_s"] <= 4.5 * w, rec


@pytest.mark.parametrize("phase", ["eval", "checkpoint"])
def test_a_trainer_stalled_in_an_eval_or_a_checkpoint_is_recovered(phase, ray_local, tiny_model, tmp_path,
                                                                   monkeypatch):
    """The initial eval and the first resumable checkpoint (after step 1) are calls outside the schedule:
    CALL_FACTOR x w (here the factor lowered to 2, w = 10: 20 s)."""
    from digenrl.runtime import deadlines as dl

    w = 10.0
    monkeypatch.setattr(dl, "CALL_FACTOR", 2.0)
    cfg = make_cfg(tiny_model, tmp_path / "run", *BASE, f"runtime.watchdog_s={w}", "runtime.checkpoint_every=1")
    monkeypatch.setenv("DIGENRL_TEST_HOOKS", f"inject_failure=trn0@{phase}:stall")
    summary, _ = _run(cfg, 600)
    assert isinstance(summary, dict), summary
    assert summary["version"] == 2 and summary["audit_violations"] == []
    rec = summary["recoveries"][0]
    assert rec["worker"] == "trn0" and "stalled" in rec["cause"], rec
    # noticed by the call's own deadline (2 w) or, sooner, by that of an action queued behind it on the stopped
    # rank (w: a publish after a checkpoint)
    within = float(re.search(r"no answer within ([\d.]+) s", rec["cause"]).group(1))
    assert within <= 2 * w, rec
    assert not math.isnan(summary["eval_reward_initial"])  # the initial eval ran (again, after a stall in it)
