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


@pytest.mark.parametrize("name, kind, algorithm, lora", [("sd35_medium_nft", "sd3", "nft", True),
                                                          ("flux1_dev_mixgrpo", "flux", "mixgrpo", False),
                                                          ("flux1_dev_mixgrpo_flash", "flux", "mixgrpo", False)])
def test_algorithm_preset_loads(name, kind, algorithm, lora):
    """The train.algorithm presets (issue 23): DiffusionNFT on SD3.5-M, MixGRPO (and Flash) on FLUX full FT."""
    cfg = load_config(CONFIGS / f"{name}.yaml")
    assert cfg.model.kind == kind and kind in policy_kinds() and cfg.task.name == "text"
    assert cfg.train.algorithm == algorithm and cfg.model.lora.enabled is lora
    assert set(cfg.reward) <= set(reward_names())
    assert cfg.sampler.eval_num_steps > cfg.sampler.num_steps


def _flat(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict) and k != "reward":
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def test_flash_preset_is_mixgrpo_with_the_flash_scripts_changes():
    """finetune_flux_grpo_MixGRPO_Flash.sh differs from finetune_flux_grpo_MixGRPO.sh in iters_per_group (25 -> 20)
    and dpm_algorithm_type ("null" -> "dpmsolver++", applied "post" with compress ratio 0.4): the two presets
    differ in those keys (and the run directory), nothing else. The pools, fragment size and chunk shape are
    scripts/plan_presets.py's choice for each (Flash's shorter trajectories may plan differently)."""
    planned = ("runtime.mode", "runtime.generators", "runtime.trainers", "runtime.fragment_size",
               "runtime.max_stale_fraction", "train.chunk_cells", "train.chunk_generations", "train.chunk_timesteps")
    mix = dict(_flat(load_config(CONFIGS / "flux1_dev_mixgrpo.yaml").model_dump()))
    flash = dict(_flat(load_config(CONFIGS / "flux1_dev_mixgrpo_flash.yaml").model_dump()))
    assert mix.keys() == flash.keys()
    diff = {k: (mix[k], flash[k]) for k in mix if mix[k] != flash[k] and k not in planned}
    assert diff == {"run_dir": ("runs/flux1_dev_mixgrpo", "runs/flux1_dev_mixgrpo_flash"),
                    "train.window_shift_interval": (25, 20), "sampler.post_solver": ("euler", "dpmpp_2m"),
                    "sampler.post_compress_ratio": (1.0, 0.4)}


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
