"""DanceGRPO's best-of-n (train_grpo_hunyuan.py): argsort the group's scores, keep the n/2 lowest and n/2 highest."""

import pytest
import torch

from digenrl.config import ConfigError, load_config
from digenrl.train.step_work import best_of_n


class _G:
    def __init__(self, adv):
        self.advantages = adv

    def __len__(self):
        return len(self.advantages)

    def select(self, idx):
        return sorted(idx)


def test_best_of_n_keeps_extremes():
    adv = torch.tensor([0.3, -1.2, 0.9, 0.0, -0.4, 1.5])
    s = torch.argsort(adv)
    want = sorted(torch.cat([s[-4 // 2:], s[: 4 // 2]]).tolist())  # top bestofn//2 and bottom bestofn//2
    assert best_of_n(_G(adv), 4) == want == [1, 2, 4, 5]
    with pytest.raises(ValueError, match="best_of_n"):
        best_of_n(_G(adv), 3)


def test_best_of_n_step_trains_only_the_kept_generations(tiny_policy):
    from digenrl.train.context import build_context
    from digenrl.train.loop import colocated_step

    cfg = load_config(None, ["train.prompts_per_step=2", "train.generations=4", "sampler.num_steps=4",
                             "train.timestep_fraction=0.5", "train.best_of_n=2", "log.progress=false"])
    ctx = build_context(cfg, policy=tiny_policy)
    row = colocated_step(ctx, 0)
    assert ctx.transaction.version == 1 and row["cells"] == 2 * 2 * 2  # P x n x S, not P x G x S
    with pytest.raises(ConfigError, match="train.best_of_n"):
        load_config(None, ["train.best_of_n=6", "train.generations=4"])
