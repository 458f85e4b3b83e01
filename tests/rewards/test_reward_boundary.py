"""A reward's output is checked where it enters the run (``rewards.base.WeightedSum``): one finite float score
per sample, a 1-D tensor of the batch's length, else an error naming the reward; reward weights must be finite."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from digenrl.rewards.registry import RewardConfigError, build_weighted, validate_reward_spec
from digenrl.rollout.records import Prompt

PLUGINS = Path(__file__).parent / "plugins"
FAULTY = "faulty_plugin:build_faulty"


@pytest.fixture(autouse=True)
def plugin_path(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))


def batch(n=4):
    return torch.rand(n, 3, 4, 4, generator=torch.Generator().manual_seed(0)), [Prompt(i, str(i)) for i in range(n)]


@pytest.mark.parametrize("kind,needle", [("nan", "not finite"), ("inf", "not finite"), ("column", "shape"),
                                         ("short", "shape"), ("int", "float"), ("list", "tensor")])
def test_a_bad_reward_output_is_refused_naming_the_reward(kind, needle):
    from digenrl.faults import RunHalted

    ws = build_weighted({"good": {"factory": FAULTY, "from_call": 100, "weight": 0.5},
                         "judge": {"factory": FAULTY, "kind": kind, "index": 2}})
    x, prompts = batch()
    with pytest.raises(RunHalted) as e:
        ws.score(x, prompts)
    msg = str(e.value)
    assert "reward.judge" in msg and needle in msg, msg
    if kind in ("nan", "inf"):
        assert "sample 2" in msg, msg


def test_good_outputs_pass():
    ws = build_weighted({"judge": {"factory": FAULTY, "kind": "nan", "from_call": 2}})
    x, prompts = batch()
    total, parts = ws.score(x, prompts)  # the first call is still good
    assert total.shape == (4,) and torch.isfinite(total).all() and parts["judge"].shape == (4,)


@pytest.mark.parametrize("weight", [".nan", ".inf", "-.inf"])
def test_non_finite_reward_weights_are_refused(weight):
    import yaml

    with pytest.raises(RewardConfigError, match=r"reward\.digits\.weight"):
        validate_reward_spec({"digits": {"weight": yaml.safe_load(weight)}})
