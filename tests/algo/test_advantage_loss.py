"""Advantage, clipped loss and KL on hand-checked cases, plus gradient signs."""

import math

import pytest
import torch

from digenrl.algo.advantage import group_advantages
from digenrl.algo.loss import clipped_policy_loss, gaussian_kl
from digenrl.algo.timesteps import select_timesteps


def test_group_advantages_hand_case():
    r = torch.tensor([1.0, 3.0, 5.0, 5.0])
    g = torch.tensor([0, 0, 1, 1])
    adv, stats = group_advantages(r, g, eps=0.0 + 1e-12)
    # group 0: mean 2, population std 1 -> (-1, 1); group 1: std 0 -> zeros and counted
    torch.testing.assert_close(adv, torch.tensor([-1.0, 1.0, 0.0, 0.0]))
    assert stats.zero_std_ratio == 0.5


def test_group_advantages_global_std_and_clip():
    r = torch.tensor([0.0, 2.0, 10.0, 30.0])
    g = torch.tensor([0, 0, 1, 1])
    adv, _ = group_advantages(r, g, std_mode="global", eps=0.0, adv_clip_max=100)
    gstd = r.std(unbiased=False)
    torch.testing.assert_close(adv, torch.tensor([-1.0, 1.0, -10.0, 10.0]) / gstd)
    adv, _ = group_advantages(torch.tensor([0.0, 1.0]), torch.tensor([0, 0]), eps=0.0, adv_clip_max=0.5)
    torch.testing.assert_close(adv, torch.tensor([-0.5, 0.5]))
    with pytest.raises(ValueError, match="std_mode"):
        group_advantages(r, g, std_mode="batch")


def test_clipped_loss_values_and_stats():
    logp = torch.tensor([math.log(1.5), math.log(0.5), 0.0])
    old = torch.zeros(3)
    adv = torch.tensor([1.0, -1.0, 2.0])
    loss, stats = clipped_policy_loss(logp, old, adv, clip_range=0.2)
    # ratio 1.5, A=1: max(-1.5, -1.2) = -1.2 ; ratio 0.5, A=-1: max(0.5, 0.8) = 0.8 ; ratio 1, A=2: -2
    torch.testing.assert_close(loss, torch.tensor([-1.2, 0.8, -2.0]))
    assert stats.clipfrac.item() == pytest.approx(2 / 3)
    ref_kl = 0.5 * (math.log(1.5) ** 2 + math.log(0.5) ** 2) / 3
    assert stats.approx_kl.item() == pytest.approx(ref_kl)


def test_gradient_sign_raises_logprob_of_positive_advantage():
    logp = torch.zeros(2, requires_grad=True)
    loss, _ = clipped_policy_loss(logp, torch.zeros(2), torch.tensor([1.0, -1.0]), clip_range=0.2)
    loss.sum().backward()
    # gradient descent on the loss raises log-prob where A > 0 and lowers it where A < 0
    assert logp.grad[0] < 0 < logp.grad[1]


def test_clipped_region_has_no_gradient():
    logp = torch.tensor([math.log(2.0)], requires_grad=True)
    loss, _ = clipped_policy_loss(logp, torch.zeros(1), torch.tensor([1.0]), clip_range=0.2)
    loss.sum().backward()
    assert logp.grad.item() == 0.0


def test_gaussian_kl_matches_torch_distributions():
    g = torch.Generator().manual_seed(0)
    m1, m2 = torch.randn(2, 3, 4, generator=g), torch.randn(2, 3, 4, generator=g)
    std = torch.tensor([0.3, 0.7]).reshape(2, 1, 1)
    ours = gaussian_kl(m1, m2, std)
    ref = torch.distributions.kl_divergence(
        torch.distributions.Normal(m1, std.expand_as(m1)), torch.distributions.Normal(m2, std.expand_as(m2))
    ).mean(dim=(1, 2))
    torch.testing.assert_close(ours, ref)


def test_timestep_selection():
    assert select_timesteps(10, fraction=0.6).trained == tuple(range(6))
    assert select_timesteps(10, strategy="uniform", fraction=0.3).trained == (0, 4, 9)
    assert select_timesteps(10, fraction=1.0, sde_kind="cps").trained == tuple(range(9))
    w1 = select_timesteps(10, strategy="window", window_size=3, seed=1, step=4)
    w2 = select_timesteps(10, strategy="window", window_size=3, seed=1, step=4)
    assert w1 == w2 and len(w1.trained) == 3 and w1.sde_steps == w1.trained
    starts = {select_timesteps(10, strategy="window", window_size=3, seed=1, step=s).trained[0] for s in range(30)}
    assert len(starts) > 1  # the window moves between steps
    with pytest.raises(ValueError, match="fraction"):
        select_timesteps(10, fraction=1.5)
    with pytest.raises(ValueError, match="window"):
        select_timesteps(4, strategy="window", window_size=6)
