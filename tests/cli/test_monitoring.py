"""Monitoring a user expects (issue 24, item 3): sample grids and per-reward curves in TensorBoard and wandb,
an autoscaled reward figure (negative rewards visible), a warning and a metric when every reward of a step ties
(nothing trains), and one readable line per step in the terminal (stdout; stderr keeps errors and warnings)."""

from __future__ import annotations

import json
import sys
import types

import torch

from digenrl.cli import main
from digenrl.observe.plots import reward_curve

TINY = ["steps=2", "log.progress=false", "train.prompts_per_step=2", "train.generations=2", "eval.num_prompts=4",
        "eval.grid_prompts=4", "sampler.num_steps=2", "eval.every=0", "runtime.checkpoint_every=0"]


def build_constant(value: float = 0.0):
    """A reward that gives every sample the same score (Flow-GRPO's OCR reward at the start: all 0)."""
    def constant(images, prompts):
        return torch.full((len(prompts),), float(value))
    return constant


def test_reward_curve_autoscales_and_draws_each_reward(tmp_path):
    rows = [{"step": 0, "eval_reward": -2.5}] + [
        {"step": k, "reward_mean": -3.0 + 0.1 * k, "reward/jpeg": -4.0 + 0.1 * k, "reward/aesthetic": 5.5 + 0.01 * k}
        for k in range(1, 11)]
    info = reward_curve(rows, tmp_path / "c.png")
    lo, hi = info["ylim"]
    assert lo < -4.0 + 0.1 and hi > 5.5  # every curve inside the axes, negative ones included
    assert (tmp_path / "c.png").stat().st_size > 0
    assert {"reward/jpeg", "reward/aesthetic"} <= set(info["labels"])
    flat = reward_curve([{"step": k, "reward_mean": 0.5} for k in range(1, 4)], tmp_path / "d.png")["ylim"]
    assert flat[0] < 0.5 < flat[1]  # a constant curve still gets a visible range


def test_tensorboard_gets_sample_grids_and_per_reward_curves(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", *TINY, "log.tensorboard=true"]) == 0
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    tags = acc.Tags()
    assert {"samples/before", "samples/after"} <= set(tags["images"])
    img = acc.Images("samples/after")[0]
    assert img.step == 2 and img.width > 50 and img.height > 50
    assert "reward/digits" in tags["scalars"] and len(acc.Scalars("reward/digits")) == 2


def test_wandb_gets_images_when_installed(tmp_path, monkeypatch):
    calls = {"log": [], "init": []}
    fake = types.ModuleType("wandb")

    class Run:
        def log(self, data, step=None):
            calls["log"].append((step, data))

        def finish(self):
            calls["finished"] = True

    fake.init = lambda **kw: calls["init"].append(kw) or Run()
    fake.Image = lambda data, caption=None: ("image", getattr(data, "shape", None), caption)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", *TINY, "log.wandb=true", "log.wandb_project=p"]) == 0
    assert calls["init"][0]["project"] == "p" and calls.get("finished")
    images = [(s, d) for s, d in calls["log"] if any(k.startswith("samples/") for k in d)]
    assert [s for s, _ in images] == [0, 2]
    kind, shape, _ = images[1][1]["samples/after"]
    assert kind == "image" and shape[2] == 3
    assert any("reward/digits" in d for _, d in calls["log"])


def test_tied_rewards_warn_and_are_counted(tmp_path, capsys):
    run = tmp_path / "run"
    reward = "reward={flat: {factory: 'test_monitoring:build_constant', value: 0.0}}"
    assert main(["train", f"run_dir={run}", *TINY, reward]) == 0
    err = capsys.readouterr().err
    assert "warning: step 1: every reward of the step ties (0.000)" in err and "nothing trains" in err
    assert err.count("every reward of the step ties") == 1  # once per run of tied steps, not every step
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "reward_mean" in r]
    assert [r["no_signal"] for r in trained] == [1.0, 1.0] and all(r["zero_std_ratio"] == 1.0 for r in trained)


def test_a_readable_line_per_step(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", *TINY]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("step ")]
    assert len(lines) == 2, lines
    assert lines[0].startswith("step 1/2 | reward ") and "digits " in lines[0] and "samples/s" in lines[0]
    run2 = tmp_path / "quiet"
    assert main(["train", f"run_dir={run2}", *TINY, "log.print_every=0"]) == 0
    assert not [x for x in capsys.readouterr().out.splitlines() if x.startswith("step ")]
