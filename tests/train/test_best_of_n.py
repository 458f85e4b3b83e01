"""DanceGRPO's best-of-n (train_grpo_hunyuan.py): argsort the group's scores, keep the n/2 lowest and n/2 highest."""

import pytest
import torch

from digenrl.config import ConfigError, load_config
from digenrl.train.sample_masks import best_of_n_mask


def _dancegrpo_selection(scores, n):
    """XueZeyue/DanceGRPO@15cc71d5 train_grpo_hunyuan.py, written independently: argsort the scores, take the last
    n // 2 and the first n // 2 indices."""
    s = torch.argsort(scores)
    return sorted(torch.cat([s[-n // 2:], s[: n // 2]]).tolist())


def test_best_of_n_keeps_extremes():
    r = torch.tensor([0.3, -1.2, 0.9, 0.0, -0.4, 1.5], dtype=torch.float64)
    adv = (r - r.mean()) / (r.std() + 1e-8)  # DanceGRPO: the whole group's mean and (unbiased) std
    mask = best_of_n_mask(r.tolist(), None, 4, unbiased=True, eps=1e-8)
    assert torch.nonzero(mask).flatten().tolist() == _dancegrpo_selection(adv, 4) == [1, 2, 4, 5]
    with pytest.raises(ValueError, match="best_of_n"):
        best_of_n_mask(r.tolist(), None, 3)


def test_best_of_n_per_reward_score_is_the_weighted_sum_of_group_advantages():
    """vq_coef A_vq + mq_coef A_mq, each normalised over the whole group (not the reward sum's advantage)."""
    g = torch.Generator().manual_seed(0)
    vq, mq = torch.rand(8, generator=g, dtype=torch.float64), 10 * torch.rand(8, generator=g, dtype=torch.float64)
    norm = lambda v: (v - v.mean()) / (v.std() + 1e-8)
    want = _dancegrpo_selection(1.0 * norm(vq) + 0.5 * norm(mq), 4)
    got = best_of_n_mask((vq + 0.5 * mq).tolist(), {"vq": vq.tolist(), "mq": mq.tolist()}, 4,
                         weights={"vq": 1.0, "mq": 0.5}, unbiased=True, eps=1e-8)
    assert torch.nonzero(got).flatten().tolist() == want
    assert want != _dancegrpo_selection(norm(vq + 0.5 * mq), 4)  # the case tells the two scores apart


def test_best_of_n_step_trains_only_the_kept_generations(tiny_policy):
    from product import product_steps

    cfg = load_config(None, ["train.prompts_per_step=2", "train.generations=4", "sampler.num_steps=4",
                             "train.timestep_fraction=0.5", "train.best_of_n=2", "log.progress=false"])
    worker, (row,) = product_steps(cfg, policy=tiny_policy, steps=1)
    assert worker.ctx.transaction.version == 1 and row["cells"] == 2 * 2 * 2  # P x n x S, not P x G x S
    with pytest.raises(ConfigError, match="train.best_of_n"):
        load_config(None, ["train.best_of_n=6", "train.generations=4"])


def test_masks_drop_unselected_cells_before_the_forward():
    """The trainers' form: a rank's cells outside the mask are dropped (nothing to run), except on a sharded pool,
    where a rank left with none joins the collectives with its first cell at weight 0 (unless the whole chunk is
    masked: then every rank skips it)."""
    from digenrl.train.sample_masks import masked_cells

    mask = torch.tensor([True, False, False, True])
    assert masked_cells([(0, 0), (1, 0), (3, 1)], 1.0, mask, collective=False) == ([(0, 0), (3, 1)], 1.0)
    assert masked_cells([(1, 0), (2, 1)], 1.0, mask, collective=False) == ([], 1.0)
    chunk = [(0, 0), (1, 0), (2, 1)]  # rank 0's share [(0, 0)], rank 1's [(1, 0), (2, 1)]
    assert masked_cells([(1, 0), (2, 1)], 1.0, mask, collective=True, chunk=chunk) == ([(1, 0)], 0.0)
    assert masked_cells([(1, 0), (2, 1)], 1.0, mask, collective=True, chunk=[(1, 0), (2, 1)]) == ([], 1.0)  # all skip


def test_kept_masks_count_what_the_round_trains():
    """best_of_n with the zero-advantage filter: the selection, less its A = 0 samples (the tied group's)."""
    from digenrl.train.loss_scale import step_advantages
    from digenrl.train.sample_masks import kept_masks

    cfg = load_config(None, ["train.prompts_per_step=2", "train.generations=4", "train.best_of_n=2"])
    rewards = {0: [0.5, 0.5, 0.5, 0.5], 1: [0.1, 0.9, 0.4, 0.2]}
    m = kept_masks(cfg, step_advantages(rewards, cfg.train), rewards, None, step=0)
    assert m[0].tolist() == [False] * 4 and m[1].tolist() == [True, True, False, False]
    off = load_config(None, ["train.prompts_per_step=2", "train.generations=4", "train.best_of_n=2",
                             "train.filter_zero_advantage=false"])
    m = kept_masks(off, step_advantages(rewards, off.train), rewards, None, step=0)
    assert m[0].tolist() == [True, False, False, True]  # tied: stable order, the first and the last
