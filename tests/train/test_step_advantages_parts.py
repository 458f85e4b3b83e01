"""``loss_scale.step_advantages`` (the Ray trainers' advantages from the executor's plain numbers) against the
reference loop's ``assign_advantages`` on the same batch, with per-reward advantages whose reward names are not
in alphabetical order: the columns must keep the reward's (the config's) order, the order of the weights."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from digenrl.config import load_config
from digenrl.train.loss_scale import step_advantages
from digenrl.train.step_math import adv_options, assign_advantages


def test_per_reward_columns_keep_the_reward_order():
    cfg = load_config(None, ["train.adv_per_reward=true", "train.generations=4",
                             "reward={pickscore: {weight: 0.7}, clip_score: {weight: 0.3}}"])
    g = torch.Generator().manual_seed(0)
    groups = [0, 1, 2]
    parts = {grp: {"pickscore": tuple(torch.rand(4, generator=g).tolist()),
                   "clip_score": tuple((10 * torch.rand(4, generator=g)).tolist())} for grp in groups}
    rewards = {grp: tuple(0.7 * a + 0.3 * b for a, b in zip(parts[grp]["pickscore"], parts[grp]["clip_score"]))
               for grp in groups}
    got = step_advantages(rewards, cfg.train, parts)
    # the reference loop: one batch of the groups in index order, reward_parts in the reward's order
    batch = SimpleNamespace(
        rewards=torch.tensor([x for grp in groups for x in rewards[grp]], dtype=torch.float64),
        uids=torch.tensor([grp for grp in groups for _ in range(4)]),
        reward_parts={k: torch.tensor([x for grp in groups for x in parts[grp][k]], dtype=torch.float64)
                      for k in ("pickscore", "clip_score")})
    assign_advantages(batch, adv_options(cfg.train))
    want = batch.advantages
    assert want.shape == (12, 2)
    torch.testing.assert_close(torch.cat([got[grp] for grp in groups]), want)
    assert not torch.allclose(want[:, 0], want[:, 1])  # the two columns differ: an order swap would show
