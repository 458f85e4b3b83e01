"""A Ray run says what it is doing (issue 38, item 2): progress lines for start-up, model load and the eval before
RL come before step 1's line; every worker's stdout / stderr is saved in ``run_dir/logs/<worker>.log``; a failing
worker's last log lines are printed with the failure. Run through the CLI, as a user sees it."""

from __future__ import annotations

import os
import subprocess
import sys

from runtime_helpers import SMALL


def test_ray_run_progress_logs_and_failure_tail(tiny_model, tmp_path):
    run = tmp_path / "run"
    args = [f"model.path={tiny_model}", f"run_dir={run}", *[a for a in SMALL if not a.startswith("log.")],
            "steps=2", "runtime.mode=gap_tsp_tag", "runtime.max_restarts=0"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "DIGENRL_TEST_HOOKS": "inject_failure=gen0@2"}
    proc = subprocess.run([sys.executable, "-m", "digenrl.cli", "train", *args],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:]  # the injected failure, no restart allowed
    lines = out.splitlines()
    idx = {key: next((i for i, x in enumerate(lines) if x.startswith(key)), None) for key in (
        "digenrl: starting a local Ray: ", "digenrl: starting 1 generator(s) and 1 trainer rank(s)",
        "digenrl: eval before RL", "digenrl: calibration: timing each operation", "digenrl: run failed:")}
    assert None not in idx.values(), (idx, out[-3000:])
    assert list(idx.values()) == sorted(idx.values()), idx  # in the order the run does them
    assert f"logs in {run / 'logs'}" in out
    assert sorted(p.name for p in (run / "logs").iterdir()) == ["gen0.log", "trn0.log"]  # one file per worker
    gen_log = (run / "logs" / "gen0.log").read_text()
    assert gen_log.startswith("[digenrl] worker gen0 (pid ")
    tail = out[out.index("--- last "):]
    assert f"lines of gen0's log ({run / 'logs' / 'gen0.log'}) ---" in tail.splitlines()[0]
    assert "[digenrl] worker gen0" in tail  # the log's own lines
    assert "InjectedFailure: injected failure of gen0" in tail.splitlines()[-2]  # the worker's traceback, to its end
    assert "\x1b[" not in gen_log
