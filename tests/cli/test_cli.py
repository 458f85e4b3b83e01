"""CLI: a short run writes every output; bad keys/values are refused with exit code 2 and nothing written."""

import json
import subprocess
import sys

import pytest

from digenrl.cli import main

SHORT = ["steps=2", "train.prompts_per_step=2", "train.generations=4", "sampler.num_steps=4", "eval.num_prompts=4",
         "eval.grid_prompts=4", "eval.every=1", "log.progress=false"]


def test_short_run_writes_every_output(tmp_path):
    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", *SHORT]) == 0
    for name in ["config.yaml", "metrics.jsonl", "reward_curve.png", "samples_before.png", "samples_after.png",
                 "checkpoint.safetensors", "summary.json"]:
        assert (run / name).is_file() and (run / name).stat().st_size > 0, name
    summary = json.loads((run / "summary.json").read_text())
    for key in ["eval_reward_initial", "eval_reward_final", "steps", "wall_s", "samples_per_s"]:
        assert key in summary
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward_mean" in r]
    assert len(steps) == 2
    for key in ["reward_std", "loss", "approx_kl", "clipfrac", "zero_std_ratio", "timing_s/gen", "timing_s/train", "samples_per_s"]:
        assert key in steps[0]
    # the checkpoint loads back as a policy
    from digenrl.models.tiny_dit import TinyDiTPolicy

    TinyDiTPolicy.load(run / "checkpoint.safetensors")


@pytest.mark.parametrize(
    "override,needle",
    [("train.lrr=1", "train.lrr: unknown key"), ("train.lr=abc", "train.lr"), ("steps=-3", "steps"),
     ("sampler.kind=ddim", "sampler.kind"), ("model.path=/nonexistent/x.safetensors", "model.path")],
)
def test_bad_config_exits_2_and_writes_nothing(tmp_path, override, needle):
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "digenrl.cli", "train", f"run_dir={run}", override, "log.progress=false"],
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
    assert not run.exists()


def test_missing_config_file(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "digenrl.cli", "train", "--config", str(tmp_path / "nope.yaml")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "nope.yaml" in proc.stderr


def test_yaml_config_and_override(tmp_path):
    from digenrl.config import load_config

    f = tmp_path / "c.yaml"
    f.write_text("train:\n  lr: 0.001\nsteps: 5\n")
    cfg = load_config(f, ["train.lr=2e-4"])
    assert cfg.train.lr == 2e-4 and cfg.steps == 5


def test_tensorboard_logging(tmp_path):
    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", "log.tensorboard=true", *SHORT]) == 0
    events = list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    assert "reward_mean" in acc.Tags()["scalars"]
    assert len(acc.Scalars("reward_mean")) == 2


@pytest.mark.parametrize("command", ["eval", "sample"])
def test_eval_and_sample_refuse_bad_model_path(tmp_path, command):
    proc = subprocess.run([sys.executable, "-m", "digenrl.cli", command, f"model.path={tmp_path}/missing.safetensors"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2 and "model.path" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_sample_and_eval_run(tmp_path):
    out = tmp_path / "grid.png"
    assert main(["sample", "--out", str(out), "--num", "4", "sampler.num_steps=4"]) == 0
    assert out.stat().st_size > 0
    assert main(["eval", "eval.num_prompts=4", "sampler.num_steps=4"]) == 0
