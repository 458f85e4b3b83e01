"""The real-model config presets validate against ``digenrl.config.Config``."""

from pathlib import Path

import pytest

from digenrl.config import load_config
from digenrl.models.registry import policy_kinds
from digenrl.rewards.registry import reward_names

CONFIGS = Path(__file__).parents[2] / "configs"


@pytest.mark.parametrize("name, kind", [("sd35_medium", "sd3"), ("flux1_dev", "flux"), ("wan21_14b", "wan"),
                                        ("qwen_image", "qwen_image")])  # fmt: skip
def test_preset_loads(name, kind):
    cfg = load_config(CONFIGS / f"{name}.yaml")
    assert cfg.model.kind == kind and kind in policy_kinds()
    assert cfg.model.lora.enabled and cfg.task.name == "text"
    assert set(cfg.reward) <= set(reward_names())
    assert cfg.sampler.eval_num_steps > cfg.sampler.num_steps
