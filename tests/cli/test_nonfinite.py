"""A non-finite value never reaches the weights: non-finite or out-of-range config values are refused up front
(exit 2, the key named, nothing written); a reward that returns NaN for one sample, or a commit whose gradient
norm is not finite, stops the run with exit 2 naming the step, before the optimizer steps: no checkpoint of the
bad weights is written and the last good resumable checkpoints stay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from digenrl.cli import main

PLUGINS = Path(__file__).resolve().parents[1] / "rewards" / "plugins"
TINY = ["train.prompts_per_step=2", "train.generations=4", "sampler.num_steps=4", "eval.num_prompts=4",
        "eval.grid_prompts=2", "eval.every=0", "log.progress=false"]


@pytest.mark.parametrize("override,key", [
    ("train.lr=.inf", "train.lr"), ("train.lr=inf", "train.lr"), ("train.lr=nan", "train.lr"),
    ("train.weight_decay=.inf", "train.weight_decay"), ("sampler.noise_level=.inf", "sampler.noise_level"),
    ("sampler.cfg_scale=.inf", "sampler.cfg_scale"), ("train.max_grad_norm=.nan", "train.max_grad_norm"),
    ("train.max_grad_norm=-1", "train.max_grad_norm"), ("train.max_grad_norm=0", "train.max_grad_norm"),
    ("train.adam_epsilon=.nan", "train.adam_epsilon"), ("train.betas=[0.9, .inf]", "train.betas"),
    ("train.betas=[1.5, 0.999]", "train.betas"), ("train.ema_decay=.nan", "train.ema_decay"),
    ("train.ema_decay=1.5", "train.ema_decay"), ("model.lora.alpha=.inf", "model.lora.alpha"),
    ("runtime.max_stale_fraction=.nan", "runtime.max_stale_fraction"),
    ("reward={digits: {weight: .nan}}", "reward.digits.weight"), ("reward={digits: {weight: .inf}}", "reward.digits.weight"),
])
def test_non_finite_or_out_of_range_values_are_refused(tmp_path, capsys, override, key):
    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", "steps=1", *TINY, override]) == 2
    err = capsys.readouterr().err
    assert err.startswith("digenrl: error: ") and key in err, err
    assert not run.exists()


def _finite_checkpoint(path: Path) -> None:
    from safetensors.torch import load_file

    for k, v in load_file(str(path)).items():
        if v.is_floating_point():
            assert torch.isfinite(v).all(), k


def _checkpoints(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir())


def test_a_nan_reward_for_one_sample_stops_the_run(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    run = tmp_path / "run"
    # call 1: the eval before RL, call 2: step 1, call 3: step 2 -> NaN for one of its 8 samples
    reward = "reward={judge: {factory: 'faulty_plugin:build_faulty', kind: nan, from_call: 3, index: 5}}"
    args = ["train", f"run_dir={run}", "steps=3", *TINY, "runtime.checkpoint_every=1", reward]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("digenrl: error: ") and len(err.strip().splitlines()) == 1, err
    assert "step 2: reward.judge" in err and "not finite" in err, err  # the step after the checkpoint's one
    assert _checkpoints(run) == ["step_00000001.safetensors"]  # the good one; nothing after it
    _finite_checkpoint(run / "checkpoints" / "step_00000001.safetensors")
    assert not (run / "checkpoint.safetensors").exists() and not (run / "summary.json").exists()
    failure = json.loads((run / "failure.json").read_text())
    assert "reward.judge" in failure["error"] and failure["checkpoint"].endswith("step_00000001.safetensors")


def test_a_non_finite_gradient_stops_the_run_before_the_optimizer_step(tmp_path, capsys, monkeypatch):
    from digenrl.runtime.trainer import TrainerWorker

    train = TrainerWorker.train

    def poisoned(self, chunk, *args):
        out = train(self, chunk, *args)
        if chunk.step == 1:  # the scheduler's step 1: the second, "step 2/3" on the progress line
            p = next(p for p in self.policy.parameters() if p.grad is not None)
            p.grad.view(-1)[0] = float("nan")
        return out

    monkeypatch.setattr(TrainerWorker, "train", poisoned)
    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", "steps=3", *TINY, "runtime.checkpoint_every=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("digenrl: error: ") and "step 2: gradient norm" in err, err
    assert _checkpoints(run) == ["step_00000001.safetensors"]
    _finite_checkpoint(run / "checkpoints" / "step_00000001.safetensors")
    assert not (run / "checkpoint.safetensors").exists()
    assert "gradient norm" in json.loads((run / "failure.json").read_text())["error"]


@pytest.mark.slow
def test_a_nan_reward_in_a_ray_run_is_not_retried(tmp_path):
    """Ray modes: the generator's error is not a worker failure to restart from (the replay would score the same
    NaN): no restart, exit 2, failure.json, the checkpoints before it kept."""
    import os
    import subprocess
    import sys

    run = tmp_path / "run"
    reward = "reward={judge: {factory: 'faulty_plugin:build_faulty', kind: nan, from_call: 3, index: 1}}"
    path = os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")]))  # (the checkout under test)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}  # the workers import the plug-in
    proc = subprocess.run([sys.executable, "-m", "digenrl.cli", "train", "runtime.mode=gap_tsp", f"run_dir={run}",
                           "steps=3", "runtime.checkpoint_every=1", *TINY, reward],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stderr[-3000:]
    # generator calls 1-2 score step 1's two fragments, call 3 the first of step 2
    assert "step 2: reward.judge" in proc.stderr and "gen0" in proc.stderr, proc.stderr[-3000:]
    assert _checkpoints(run) == ["step_00000001.safetensors"] and not (run / "checkpoint.safetensors").exists()
    failure = json.loads((run / "failure.json").read_text())
    assert "not finite" in failure["error"] and failure["kind"] == "halted" and failure["restarts"] == 0
