"""Plug-in rewards: a module in the test directory found by 'module:factory' path, by the ``factory`` option
and by an installed entry point; typed options validated before anything is built or written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from digenrl.cli import main
from digenrl.rewards.registry import (
    ENTRY_POINT_GROUP,
    RewardConfigError,
    build_weighted,
    reward_names,
    validate_reward_spec,
)
from digenrl.rollout.records import Prompt

PLUGINS = Path(__file__).parent / "plugins"
PATH = "brightness_plugin:build_brightness"


@pytest.fixture
def plugin_path(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))


def images():
    x = torch.zeros(2, 3, 4, 4)
    x[0, 0] = 0.5
    x[1, 0] = 0.9
    return x, [Prompt(0, "a"), Prompt(1, "b")]


def test_module_path_and_factory_option_build_the_plugin(plugin_path):
    x, prompts = images()
    ws = build_weighted({PATH: {"weight": 2.0, "target": 0.5}, "b": {"factory": PATH, "target": 0.9, "weight": 1.0}})
    total, parts = ws.score(x, prompts)
    torch.testing.assert_close(parts[PATH], torch.tensor([0.0, -0.4]))  # -|mean - 0.5|
    torch.testing.assert_close(parts["b"], torch.tensor([-0.4, 0.0]))
    torch.testing.assert_close(parts["b/mean"], torch.tensor([0.5, 0.9]))  # the plug-in's own breakdown
    torch.testing.assert_close(total, 2.0 * parts[PATH] + parts["b"])


def test_entry_point_plugin(plugin_path, tmp_path, monkeypatch):
    dist = tmp_path / "site" / "digenrl_test_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: digenrl-test-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nbrightness = {PATH}\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert "brightness" in reward_names()
    x, prompts = images()
    _, parts = build_weighted({"brightness": {"target": 0.9}}).score(x, prompts)
    torch.testing.assert_close(parts["brightness"], torch.tensor([-0.4, 0.0]))


@pytest.mark.parametrize(
    "spec,needle",
    [
        ({"digits": {"weight": 1, "foo": 2}}, "reward.digits.foo: unknown option"),
        ({PATH: {"targett": 0.3}}, f"reward.{PATH}.targett: unknown option"),
        ({PATH: {"target": "bright"}}, f"reward.{PATH}.target"),
        ({"jpeg_compressibility": {"scale": "linear"}}, "reward.jpeg_compressibility.scale"),
        ({"remote": {}}, "reward.remote.url: required option is missing"),
        ({"digits": {"weight": "heavy"}}, "reward.digits.weight: expected a number"),
        ({"nope": {}}, "reward.nope: unknown reward"),
        ({"x": {"factory": "no_such_module_xyz:f"}}, "reward.x.factory: cannot import module 'no_such_module_xyz'"),
        ({"x": {"factory": "brightness_plugin:missing"}}, "has no attribute 'missing'"),
        # each reward's own checks, before anything is loaded
        ({"clipscore": {"model_path": "/no/such/clip"}}, "reward.clipscore: reward clipscore: no CLIP model at '/no/such/clip'"),
        ({"pickscore": {}}, "option model_path (a local CLIP directory) is required"),
        ({"aesthetic": {"model_path": str(PLUGINS)}}, "no CLIP model"),
        ({"vlm_judge": {"base_url": "http://x/v1", "model": "m", "prompt_template": "no slot"}}, "placeholder {prompt}"),
        ({"vlm_judge": {"base_url": "x/v1", "model": "m"}}, "base_url must start with http"),
        ({"geneval": {"detector_url": "http://x", "detector_path": "/m"}}, "exactly one of"),
        ({"geneval": {"detector_path": "/no/such/detr"}}, "detector_path '/no/such/detr' holds no model"),
        ({"remote": {"url": "ftp://x"}}, "url must start with http"),
    ],
)
def test_bad_reward_options_are_named(plugin_path, spec, needle):
    with pytest.raises((RewardConfigError, FileNotFoundError)) as err:  # the latter for missing weight files
        validate_reward_spec(spec)
    assert needle in str(err.value)


def test_cli_refuses_unknown_option_with_exit_2_and_writes_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"run_dir": str(run), "reward": {"digits": {"weight": 1, "foo": 2}}}))
    assert main(["train", "--config", str(cfg)]) == 2
    assert "reward.digits.foo: unknown option" in capsys.readouterr().err
    assert not run.exists()


def test_cli_refuses_missing_reward_weights_before_writing(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", "reward={digits: {weight: 1}, clipscore: {model_path: /no/such/clip}}"]) == 2
    assert "reward.clipscore" in capsys.readouterr().err and not run.exists()


def test_cli_eval_with_plugin_from_config(plugin_path, tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"reward": {PATH: {"target": 0.0, "channel": 0}}, "eval": {"num_prompts": 2},
                                   "sampler": {"num_steps": 2}}))  # fmt: skip
    assert main(["eval", "--config", str(cfg)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert -1.0 <= out["eval_reward"] < 0.0  # -|mean brightness - 0|: the plug-in scored the samples (digits is >= 0)
