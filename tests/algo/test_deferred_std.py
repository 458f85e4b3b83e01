"""Deferred global std: training with a provisional scale and rescaling the gradient at commit equals training
with the step's global std (when the module's exactness conditions hold)."""

import copy

import pytest
import torch

from digenrl.algo.advantage import group_advantages
from digenrl.algo.deferred_std import plan_rescale, provisional_advantages
from digenrl.algo.timesteps import select_timesteps
from digenrl.rollout.sampler import SamplerSettings
from digenrl.tasks.digits import DigitsTask
from digenrl.train.chunk_loss import LossSettings
from digenrl.train.step_work import generate, split_groups, train_group
from digenrl.train.transaction import GradientTransaction


def _batch(policy):
    prompts = DigitsTask().train_prompts(0, 3, seed=0)
    rep = [p for p in prompts for _ in range(4)]
    gens = [g for _ in prompts for g in range(4)]
    b = generate(policy, rep, gens, step=0, run_seed=1, version=0, settings=SamplerSettings(num_steps=4, noise_level=0.8),
                 plan=select_timesteps(4, fraction=0.5))
    b.rewards = torch.rand(len(b), generator=torch.Generator().manual_seed(3))
    return b


def _train(policy, batch, adv, grad_scale, clip):
    opt = torch.optim.SGD(policy.parameters(), lr=0.1)  # not scale-invariant (Adam nearly is), so the factor shows
    tx = GradientTransaction(policy.parameters(), opt, max_grad_norm=None)
    batch.advantages = adv
    tx.begin(0)
    for g in split_groups(batch):
        train_group(policy, g, settings=LossSettings(noise_level=0.8, clip_range=clip), loss_scale=1 / (len(batch) * 2),
                    chunk_generations=4, chunk_timesteps=2)
    tx.commit(grad_scale=grad_scale)
    return {n: p.detach().clone() for n, p in policy.named_parameters()}


def test_provisional_scale_then_rescale_equals_global_std(tiny_policy):
    batch = _batch(tiny_policy)
    lam0 = 1.7  # e.g. from the previous step
    plan = plan_rescale(batch.rewards, batch.uids, lam0)
    assert plan.exact, plan.reason
    ref_adv, _ = group_advantages(batch.rewards, batch.uids, std_mode="global")
    lam = 1 / (float(batch.rewards.double().std(unbiased=False)) + 1e-4)
    assert plan.grad_scale == pytest.approx(lam / lam0)
    ref = _train(copy.deepcopy(tiny_policy), batch, ref_adv, 1.0, 0.2)
    got = _train(copy.deepcopy(tiny_policy), batch, provisional_advantages(batch.rewards, batch.uids, lam0, 5.0),
                 plan.grad_scale, 0.2)
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], rtol=1e-5, atol=1e-7)


def test_rescale_is_reported_inexact_when_clipped_or_kl():
    r = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.5, 0.5])
    gid = torch.tensor([0, 0, 0, 0, 1, 1])
    assert not plan_rescale(r, gid, 100.0).exact  # lambda_0 * 0.75 > 5: clipped at the provisional scale
    assert not plan_rescale(r, gid, 1.0, beta_kl=0.01).exact
    assert plan_rescale(r, gid, 1.0).exact
    with pytest.raises(ValueError):
        plan_rescale(r, gid, 0.0)
