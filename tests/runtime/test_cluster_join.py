"""Joining a `ray start` cluster (head + a second node on loopback, token authentication on) through
``runtime.address``: a short pipelined run places its generator and trainer on different nodes and finishes;
without the token the run is refused in one line naming the setting, before the run directory exists; a
SIGTERM to a Ray run stops it cleanly and leaves no process behind. Only processes these tests started are
stopped (never `ray stop`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from loopback_cluster import LoopbackCluster
from runtime_helpers import SMALL

pytestmark = pytest.mark.slow
CLI = [sys.executable, "-m", "digenrl.cli", "train"]
FAULT = str(Path(__file__).resolve().parents[1] / "cli" / "fault_run.py")


@pytest.fixture(scope="module")
def cluster():
    c = LoopbackCluster.started('{"gen_slot": 1}', ['{"trn_slot": 1}'], num_cpus=1)
    try:
        yield c
    finally:
        c.stop()
        assert c.leftovers() == []


def test_pipelined_run_on_a_two_node_token_cluster(cluster, tiny_model, tmp_path):
    run = tmp_path / "run"
    args = [f"model.path={tiny_model}", f"run_dir={run}", *SMALL, "steps=2", "runtime.mode=gap_tsp",
            f"runtime.address={cluster.address}", "runtime.generator_resources={gen_slot: 1}",
            "runtime.trainer_resources={trn_slot: 1}"]
    proc = subprocess.run([*CLI, *args], env=cluster.client_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["audit_violations"] == []

    other = tmp_path / "no_token"
    proc = subprocess.run([*CLI, *args, f"run_dir={other}"], env=cluster.client_env(with_token=False),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-3000:]  # no retry warnings, no traceback
    line = proc.stderr.strip()
    assert line.startswith("digenrl: error: runtime.address:") and "authentication failed" in line
    assert "RAY_AUTH_MODE=token" in line and "Traceback" not in proc.stderr
    assert not other.exists()

    # the head's token in this machine's ~/.ray/auth_token, RAY_AUTH_MODE not set: used, and said so
    env = cluster.client_env(with_token=False)
    (Path(env["HOME"]) / ".ray").mkdir(exist_ok=True)
    (Path(env["HOME"]) / ".ray" / "auth_token").write_text(cluster.token)
    local = tmp_path / "local_token"
    try:
        proc = subprocess.run([*CLI, *args, f"run_dir={local}", "steps=1"], env=env, capture_output=True, text=True,
                              timeout=300)
    finally:
        (Path(env["HOME"]) / ".ray" / "auth_token").unlink()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "asks for a token; using ~/.ray/auth_token (RAY_AUTH_MODE=token)" in proc.stderr
    assert json.loads((local / "summary.json").read_text())["steps"] == 1


def test_sigterm_stops_a_ray_run_cleanly(tiny_model, tmp_path):
    """A local Ray run (private temp dir) gets SIGTERM while publishing version 2: it abandons the step,
    records the stop, exits 75, and no process of its Ray instance is left."""
    raytmp = Path(tempfile.mkdtemp(prefix="dgr-t-", dir="/tmp"))  # short: Ray's socket paths are limited
    run = tmp_path / "run"
    env = {**os.environ, "RAY_TMPDIR": str(raytmp)}
    try:
        proc = subprocess.run([sys.executable, FAULT, "TERM@publish2", "train", f"model.path={tiny_model}",
                               f"run_dir={run}", *SMALL, "steps=4", "runtime.mode=gap_tsp"],
                              env=env, capture_output=True, text=True, timeout=300)
        _check_clean_stop(proc, run, raytmp)
    finally:  # whatever happened, end what this test started (by its private temp dir) and remove it
        import psutil

        for p in psutil.process_iter(["cmdline"]):
            if str(raytmp) in " ".join(p.info["cmdline"] or []):
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
        shutil.rmtree(raytmp, ignore_errors=True)


def _check_clean_stop(proc, run: Path, raytmp: Path) -> None:
    import psutil

    assert proc.returncode == 75, proc.stderr[-3000:]
    assert "stopped by SIGTERM" in proc.stderr.strip().splitlines()[-1] and "Traceback" not in proc.stderr
    rec = json.loads((run / "failure.json").read_text())
    assert rec["signal"] == "SIGTERM"
    # the last committed state (2 steps: the signal came while version 2 was being published) is resumable
    assert rec["step"] == 2 and (run / "checkpoints" / "step_00000002.safetensors").is_file(), rec
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if str(raytmp) in " ".join(p.info["cmdline"] or [])]
    assert left == []
    assert any(raytmp.rglob("session_*")), "the run did not use the private Ray temp dir: the check proves nothing"
