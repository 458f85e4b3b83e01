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


def test_presets_pass_the_runtime_checks():
    """Every preset is a valid Ray-runtime run (e.g. pipelined modes refuse std_mode=global with several
    minibatches per step)."""
    import glob

    from digenrl.config import load_config
    from digenrl.control.run_plan import plan_run

    files = sorted(glob.glob(str(Path(__file__).resolve().parents[2] / "configs" / "*.yaml")))
    assert len(files) >= 4
    for f in files:
        cfg = load_config(f)
        setup = plan_run(cfg)
        if cfg.train.sharding == "fsdp":  # one shard group of all trainer ranks: the scheduler's one trainer
            assert setup.plan.trainers == ("shard0",) and len(setup.trainer_ids) == cfg.runtime.trainers, f
        assert setup.plan.prompts >= 1, f
