"""Minibatches (DESIGN 1.2): M optimizer steps per step, groups split by index, logp_old = behaviour log-prob."""

import pytest
import torch

from digenrl.config import ConfigError, load_config
from digenrl.train.context import build_context
from digenrl.train.loop import train_minibatches
from digenrl.train.step_work import advantage_options, assign_advantages, generate, minibatch_of, split_groups

SMALL = ["train.prompts_per_step=4", "train.generations=4", "sampler.num_steps=4", "train.timestep_fraction=0.5",
         "log.progress=false", "train.clip_range=1e-4"]


def test_minibatch_membership_is_contiguous_by_group_index():
    assert [minibatch_of(k, 8, 2) for k in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [minibatch_of(k, 5, 2) for k in range(5)] == [0, 0, 0, 1, 1]
    assert [minibatch_of(k, 3, 3) for k in range(3)] == [0, 1, 2]


def _step(tiny_policy, *overrides):
    cfg = load_config(None, [*SMALL, *overrides])
    ctx = build_context(cfg, policy=tiny_policy)
    prompts = ctx.task.train_prompts(0, 4, cfg.seed)
    rep = [p for p in prompts for _ in range(4)]
    gens = [g for _ in prompts for g in range(4)]
    batch = generate(ctx.policy, rep, gens, step=0, run_seed=cfg.seed, version=0, settings=ctx.sampler,
                     plan=ctx.plan(0), reward=ctx.reward)
    batch.rewards = torch.rand(len(batch), generator=torch.Generator().manual_seed(1))
    assign_advantages(batch, **advantage_options(cfg.train))
    return ctx, split_groups(batch)


def test_second_minibatch_is_off_policy_and_clipped(tiny_policy):
    ctx, groups = _step(tiny_policy, "train.minibatches_per_step=2", "train.inner_epochs=2")
    out = train_minibatches(ctx, 0, groups, 2)
    assert len(out) == 4  # inner_epochs x M commits
    first = out[0][0].means()
    assert first["approx_kl"] == 0.0 and first["clipfrac"] == 0.0  # on-policy: r == 1 exactly (eval-mode sampling)
    for stats, _ in out[1:]:
        m = stats.means()
        assert m["approx_kl"] > 0 and m["clipfrac"] > 0  # the weights moved: r != 1 and the clip acts
    assert ctx.transaction.version == 1  # published once, after the last commit
    assert ctx.optimizer.state[next(iter(ctx.optimizer.state))]["step"] == 4  # one optimizer step per commit


def test_single_minibatch_keeps_ratio_one(tiny_policy):
    ctx, groups = _step(tiny_policy)
    (stats, _), = train_minibatches(ctx, 0, groups, 2)
    assert stats.means()["approx_kl"] == 0.0 and stats.cells == 4 * 4 * 2


def test_minibatches_refused_outside_the_single_process_loop():
    with pytest.raises(ConfigError, match="train.minibatches_per_step"):
        load_config(None, ["train.minibatches_per_step=2", "runtime.mode=gap"])
    with pytest.raises(ConfigError, match="train.inner_epochs"):
        load_config(None, ["train.inner_epochs=2", "runtime.trainers=2"])
    with pytest.raises(ConfigError, match="train.minibatches_per_step 9 exceeds"):
        load_config(None, ["train.minibatches_per_step=9", "train.prompts_per_step=8"])
    assert load_config(None, ["train.minibatches_per_step=2"]).train.minibatches_per_step == 2


def test_advantage_options_refused_by_the_runtime_for_now():
    with pytest.raises(ConfigError, match="train.adv_baseline='batch'"):
        load_config(None, ["train.adv_baseline=batch", "runtime.mode=naive"])
    with pytest.raises(ConfigError, match="train.adv_std_unbiased=True"):
        load_config(None, ["train.adv_std_unbiased=true", "runtime.generators=2"])
    assert load_config(None, ["train.adv_baseline=batch", "train.adv_eps=1e-8"]).train.adv_eps == 1e-8
