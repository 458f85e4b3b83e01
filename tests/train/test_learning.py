"""End-to-end: a few seeded RL steps on the demo task raise the reward; same seed -> identical metrics."""

import json

import pytest

from digenrl.config import load_config
from digenrl.runtime.driver import run_training

BASE = ["train.prompts_per_step=8", "train.generations=8", "sampler.num_steps=10", "eval.num_prompts=32",
        "eval.every=0", "log.progress=false"]


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_rl_raises_reward_on_demo_task(tmp_path):
    cfg = load_config(None, [f"run_dir={tmp_path / 'run'}", "steps=40", *BASE])
    summary = run_training(cfg)
    rows = [r for r in _rows(tmp_path / "run") if "reward_mean" in r]
    first = sum(r["reward_mean"] for r in rows[:10]) / 10
    last = sum(r["reward_mean"] for r in rows[-10:]) / 10
    assert last > first + 0.1, (first, last)
    assert summary["eval_reward_final"] > summary["eval_reward_initial"] + 0.1, summary


def test_same_seed_same_metrics(tmp_path):
    def run(name):
        cfg = load_config(None, [f"run_dir={tmp_path / name}", "steps=2", "train.prompts_per_step=2",
                                 "train.generations=4", "sampler.num_steps=4", "eval.num_prompts=4", "eval.every=0",
                                 "log.progress=false", "seed=3"])
        run_training(cfg)
        timed = ("timing_s/", "busy_s/", "idle/", "step_s", "samples_per_s")  # wall-clock figures
        return [{k: v for k, v in r.items() if not k.startswith(timed)} for r in _rows(tmp_path / name)]

    a, b = run("a"), run("b")
    assert a == b
    assert any("loss" in r for r in a)
