"""Flow-GRPO's reward table as it is written there (issue 24, item 2): ``{pickscore: 0.5}`` = weight 0.5, and its
names ``imagereward`` / ``unifiedreward`` are the built-in ImageReward / VLM judge; a Flow-GRPO reward DigenRL
does not ship is refused by name, through the CLI with exit 2."""

from __future__ import annotations

import pytest

from digenrl.cli import main
from digenrl.config import ConfigError, load_config
from digenrl.rewards.registry import RewardConfigError, parse_reward_spec


def test_bare_number_is_the_weight():
    cfg = load_config(None, ["reward={digits: 0.5, jpeg_compressibility: 2}"])
    assert cfg.reward == {"digits": {"weight": 0.5}, "jpeg_compressibility": {"weight": 2}}
    specs = {s.name: s.weight for s in parse_reward_spec(cfg.reward)}
    assert specs == {"digits": 0.5, "jpeg_compressibility": 2.0}
    assert load_config(None, ["reward={digits: null}"]).reward == {"digits": {}}
    with pytest.raises(ConfigError, match="reward.digits"):
        load_config(None, ["reward={digits: true}"])  # a bool is not a weight


def test_flow_grpo_names_are_aliases():
    from digenrl.rewards.image_reward import ImageReward
    from digenrl.rewards.registry import resolve_factory

    factory, origin = resolve_factory("imagereward")
    assert factory is ImageReward and origin.startswith("alias:image_reward")
    with pytest.raises(RewardConfigError, match="reward.imagereward.checkpoint_path: required option"):
        parse_reward_spec({"imagereward": 1.0})  # ImageReward's own options, under the table's name
    (ur,) = parse_reward_spec({"unifiedreward": {"weight": 1.0}})
    assert ur.origin.startswith("alias:vlm_judge")  # Flow-GRPO's UnifiedReward server and model by default
    assert ur.options == {"base_url": "http://127.0.0.1:17140/v1", "model": "UnifiedReward-7b-v1.5"}
    (ur2,) = parse_reward_spec({"unifiedreward": {"base_url": "http://judge:8000/v1"}})
    assert ur2.options["base_url"] == "http://judge:8000/v1"


@pytest.mark.parametrize("name", ["deqa", "qwenvl", "video_ocr", "image_similarity"])
def test_peer_reward_without_counterpart_is_named(name):
    with pytest.raises(RewardConfigError, match=f"reward.{name}: Flow-GRPO's .* is not a DigenRL reward"):
        parse_reward_spec({name: 1.0})


def test_cli_refuses_unshipped_peer_reward(tmp_path, capsys):
    rc = main(["train", f"run_dir={tmp_path / 'run'}", "reward={deqa: 1.0}", "steps=1"])
    assert rc == 2
    assert "reward.deqa: Flow-GRPO's DeQA-Score" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
