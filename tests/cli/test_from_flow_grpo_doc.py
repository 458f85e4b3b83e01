"""docs/from_flow_grpo.md is what scripts/from_flow_grpo.py writes from the config schema (issue 24, item 2): up to
date, every DigenRL key in it is a key of the schema with our default, and a default that differs is marked."""

from __future__ import annotations

import pytest

from script_loader import ROOT, load_script


def test_page_is_up_to_date():
    mod = load_script("scripts/from_flow_grpo.py")
    assert mod.main(["--check"]) == 0, "run python scripts/from_flow_grpo.py"


def test_rows_follow_the_schema(monkeypatch):
    from digenrl.config import Config

    mod = load_script("scripts/from_flow_grpo.py")
    text = mod.render()
    assert f"| `train.learning_rate` | `3e-4` | `config/base.py` | `train.lr` | `{Config().train.lr}` | **differs** |" in text
    assert "| `sample.noise_level` | `0.7` | `config/base.py` | `sampler.noise_level` | `0.7` |  |" in text
    assert "| `train.lora_path` | `None` | `config/base.py` | `model.lora_path` |" in text
    assert "| `imagereward` | `image_reward` |" in text and "| `deqa` | (none) |" in text
    monkeypatch.setattr(mod, "ROWS", [*mod.ROWS, ("x", "1", "config/base.py", "train.not_a_key", 1, "")])
    with pytest.raises(ValueError, match="train.not_a_key"):
        mod.render()


def test_readme_links_the_page():
    assert "docs/from_flow_grpo.md" in (ROOT / "README.md").read_text()
