"""Errors after validation are errors, not tracebacks (issue 22, items 7 and 9): a reward plug-in that raises
stops the run with exit 2, one line naming the reward and the step, and failure.json (the last good checkpoint
kept); values no run can use are refused up front naming the key (``sampler.eval_num_steps=-3``,
``runtime.threads_per_worker=1000``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from digenrl.cli import main

PLUGINS = Path(__file__).resolve().parents[1] / "rewards" / "plugins"
TINY = ["train.prompts_per_step=2", "train.generations=4", "sampler.num_steps=4", "eval.num_prompts=4",
        "eval.grid_prompts=2", "eval.every=0", "log.progress=false"]


def test_a_reward_plugin_that_raises_stops_the_run_cleanly(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    run = tmp_path / "run"
    # call 1: the eval before RL, call 2: step 1, call 3: step 2 raises
    reward = "reward={judge: {factory: 'raising_plugin:build_raising', from_call: 3}}"
    assert main(["train", f"run_dir={run}", "steps=3", *TINY, "runtime.checkpoint_every=1", reward]) == 2
    err = capsys.readouterr().err
    assert err.startswith("digenrl: error: ") and len(err.strip().splitlines()) == 1, err
    assert "step 2: reward.judge" in err and "plug-in kaput" in err, err  # as the progress line numbers it
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000001.safetensors"]
    failure = json.loads((run / "failure.json").read_text())
    assert "reward.judge" in failure["error"] and failure["checkpoint"].endswith("step_00000001.safetensors")


def test_a_reward_that_raises_is_named_by_the_weighted_sum():
    import torch

    from digenrl.faults import RunHalted
    from digenrl.rewards.registry import build_weighted

    import sys

    sys.path.insert(0, str(PLUGINS))
    try:
        fn = build_weighted({"judge": {"factory": "raising_plugin:build_raising", "from_call": 1}})
    finally:
        sys.path.remove(str(PLUGINS))
    with pytest.raises(RunHalted, match=r"reward\.judge: raised RuntimeError: plug-in kaput"):
        fn.score(torch.rand(2, 1, 8, 16), [None, None])


@pytest.mark.parametrize("override,key", [
    ("sampler.eval_num_steps=-3", "sampler.eval_num_steps"), ("sampler.eval_num_steps=0", "sampler.eval_num_steps"),
    ("runtime.threads_per_worker=1000", "runtime.threads_per_worker"),
    (f"runtime.threads_per_worker={(os.cpu_count() or 1) + 1}", "runtime.threads_per_worker"),
    ("train.prompts_per_step=100000", "train.prompts_per_step"),  # the digits task has 120 prompts
    ("model.device=bogus", "model.device"), ("seed=1e23", "seed"),  # (refused already: kept as regression)
])  # fmt: skip
def test_values_no_run_can_use_are_refused_up_front(tmp_path, capsys, override, key):
    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", "steps=1", *TINY, override]) == 2
    err = capsys.readouterr().err
    assert err.startswith("digenrl: error: ") and key in err, err
    assert not run.exists()


def test_eval_num_steps_may_change_on_resume():
    """It sets only the eval's sampler: a resume may change it (item 9); the training sampler's steps may not."""
    from digenrl.config import ConfigError, load_config
    from digenrl.train.resume_config import check_resume_config

    saved = load_config(None, []).model_dump(mode="json")
    check_resume_config(saved, load_config(None, ["sampler.eval_num_steps=7"]))
    with pytest.raises(ConfigError, match=r"sampler\.num_steps"):
        check_resume_config(saved, load_config(None, ["sampler.num_steps=7"]))


def test_disk_full_is_an_error_not_a_traceback_and_the_run_resumes(tmp_path, capsys, monkeypatch):
    """ENOSPC writing the second checkpoint: exit 74 (EX_IOERR), one line naming the error and how to go on,
    failure.json; the first checkpoint stays and the run resumes from it once there is space again."""
    import errno

    from digenrl.train import checkpoint as ckpt

    real, calls = ckpt.atomic_write_bytes, []

    def full(path, data):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data)

    monkeypatch.setattr(ckpt, "atomic_write_bytes", full)
    run = tmp_path / "run"
    args = ["train", f"run_dir={run}", "steps=3", *TINY, "runtime.checkpoint_every=1"]
    assert main(args) == 74
    err = capsys.readouterr().err
    assert err.startswith("digenrl: error: ") and "No space left on device" in err, err
    assert f"digenrl train --resume {run}" in err and "Traceback" not in err, err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000001.safetensors"]
    failure = json.loads((run / "failure.json").read_text())
    assert "No space left" in failure["error"] and failure["checkpoint"].endswith("step_00000001.safetensors")
    monkeypatch.setattr(ckpt, "atomic_write_bytes", real)
    assert main(["train", "--resume", str(run)]) == 0
