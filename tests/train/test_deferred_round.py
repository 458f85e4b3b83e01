"""Step-wide advantages trained before the step's rewards are in (``train.loss_scale.DeferredRound``): the
provisional heads, rescaled at the commit and corrected, give the gradient (and the loss statistics) of
training directly with the final advantages (``algo.deferred_std``), with the advantage clip acting, a
zero-advantage group, KL to the reference (beta > 0) and, off-policy, ratios outside the clip interval."""

from __future__ import annotations

import copy

import pytest
import torch

from digenrl.algo.timesteps import select_timesteps
from digenrl.config import load_config
from digenrl.rollout.sampler import SamplerSettings
from digenrl.schedule.layout import tile_grid
from digenrl.tasks.digits import DigitsTask
from digenrl.train.chunk_loss import LossSettings
from digenrl.train.loss_scale import DeferredRound, loss_scale, step_advantages
from digenrl.train.step_math import adv_options, generate

from train_helpers import split_groups, train_group

G, S = 4, 2
# exact binary fractions: the step's mean is exactly 0.5, so with the batch baseline the samples with reward 0.5
# have advantage 0 (filtered at the end although trained provisionally); group 0 ties (zero advantage with the
# group baseline); the first group trained (1) has mean 0.25 != 0.5, so the provisional branch of r = 0.25 flips
REWARDS = {0: (0.5, 0.5, 0.5, 0.5), 1: (0.0, 0.25, 0.5, 0.25), 2: (0.75, 1.0, 0.5, 0.75)}
ORDER = (1, 2, 0)  # the order the groups complete in (group 1 alone is known when the round starts)


def _random_rewards():
    g = torch.Generator().manual_seed(5)
    r = {k: tuple(float(x) for x in torch.rand(G, generator=g)) for k in (1, 2)}
    return {0: (0.3,) * G, **r}


def _setup(policy, off_policy: bool):
    prompts = DigitsTask().train_prompts(0, 3, seed=0)
    batch = generate(policy, [p for p in prompts for _ in range(G)], [g for _ in prompts for g in range(G)], step=0,
                     run_seed=1, version=0, settings=SamplerSettings(num_steps=4, noise_level=0.8),
                     plan=select_timesteps(4, fraction=0.5))
    ref = copy.deepcopy(policy)
    if off_policy:  # weights moved since sampling: ratios leave the (narrow) clip interval
        with torch.no_grad():
            torch.manual_seed(7)
            for p in policy.parameters():
                p.add_(0.05 * torch.randn_like(p))
    return split_groups(batch), ref


def _cfg(std_mode, baseline):
    return load_config(None, [f"train.std_mode={std_mode}", f"train.adv_baseline={baseline}",
                              "train.adv_clip_max=0.8", "train.filter_zero_advantage=true"]).train


def _settings(off_policy):
    return LossSettings(noise_level=0.8, clip_range=0.02 if off_policy else 0.2, beta_kl=0.05,
                        filter_zero_advantage=True)


def _grads(policy):
    return [p.grad.detach().clone() for p in policy.parameters() if p.requires_grad]


def _direct(policy, groups, rewards, cfg, settings, ref):
    """Training with the final advantages (what the reference loop does)."""
    final = step_advantages(rewards, cfg)
    for k, g in enumerate(groups):
        g.advantages = final[k][g.gen_index]
    scale = loss_scale(S, [final[k] for k in rewards], cfg.filter_zero_advantage)
    policy.zero_grad(set_to_none=True)
    stats = None
    for g in groups:
        st = train_group(policy, g, settings=settings, loss_scale=scale.cell(), chunk_generations=2, chunk_timesteps=1,
                         ref_policy=ref)
        stats = st if stats is None else stats.add(st)
    return [x * scale.commit for x in _grads(policy)], stats, final


def _deferred(policy, groups, rewards, cfg, settings, ref):
    params = [p for p in policy.parameters() if p.requires_grad]
    policy.zero_grad(set_to_none=True)
    dr = DeferredRound(adv_options(cfg), settings, params, {ORDER[0]: rewards[ORDER[0]]})
    for k in ORDER:
        for chunk in tile_grid(list(range(G)), S, 3, 1):  # another tiling than the direct run
            dr.train(policy, groups[k], k, rewards[k], chunk, loss_scale=1 / S, ref_policy=ref)
    stats = dr.finish(policy, dict(enumerate(groups)), rewards, cfg, loss_scale=1 / S, ref_policy=ref, piece=3)
    scale = loss_scale(S, step_advantages(rewards, cfg).values(), cfg.filter_zero_advantage)
    return [x * scale.commit for x in _grads(policy)], stats, dr


def _rel(a, b):
    return max(float((x - y).norm() / y.norm().clamp_min(1e-12)) for x, y in zip(a, b))


CASES = [(s, b, off) for s, b in (("global", "group"), ("group", "batch"), ("global", "batch")) for off in (False, True)]


@pytest.mark.parametrize("std_mode,baseline,off_policy", CASES)
@pytest.mark.parametrize("rewards", [REWARDS, _random_rewards()], ids=["ties", "random"])
def test_deferred_round_equals_training_with_the_final_advantages(tiny_policy, std_mode, baseline, off_policy,
                                                                   rewards):
    groups, ref = _setup(tiny_policy, off_policy)
    for k, g in enumerate(groups):
        g.rewards = torch.tensor([rewards[k][i] for i in g.gen_index.tolist()])
    cfg, settings = _cfg(std_mode, baseline), _settings(off_policy)
    want, want_stats, final = _direct(tiny_policy, groups, rewards, cfg, settings, ref)
    unclipped = step_advantages(rewards, cfg, clip=float("inf"))
    assert any(bool((final[k] != unclipped[k]).any()) for k in final)  # the advantage clip acts
    got, stats, dr = _deferred(tiny_policy, groups, rewards, cfg, settings, ref)
    err = _rel(got, want)
    assert err < 2e-5, f"deferred gradient differs by {err:.2e} (relative)"
    assert stats.trained == want_stats.trained
    for key in ("loss", "kl", "approx_kl", "clipfrac"):
        assert getattr(stats, key) == pytest.approx(getattr(want_stats, key), rel=1e-4, abs=1e-6), key
    if off_policy:
        assert dr.outside  # some ratios left the clip interval


@pytest.mark.parametrize("std_mode,baseline", [("global", "group"), ("global", "batch")])
def test_without_the_correction_pass_the_gradient_is_wrong(tiny_policy, monkeypatch, std_mode, baseline):
    """The oracle can fail: the same run without the correction pass (clip, zero-advantage KL) is far off."""
    groups, ref = _setup(tiny_policy, off_policy=False)
    for k, g in enumerate(groups):
        g.rewards = torch.tensor([REWARDS[k][i] for i in g.gen_index.tolist()])
    cfg, settings = _cfg(std_mode, baseline), _settings(False)
    want, _, _ = _direct(tiny_policy, groups, REWARDS, cfg, settings, ref)
    monkeypatch.setattr(DeferredRound, "_correct", lambda *a, **k: None)
    got, _, _ = _deferred(tiny_policy, groups, REWARDS, cfg, settings, ref)
    assert _rel(got, want) > 1e-2


# batch baseline: b0 = 0.75 (group 1, known first), m_B = 0.54; the rewards in (0.54, 0.75) change branch and
# nothing is clipped (adv_clip_max 5), so only the branch correction of the cells outside the clip interval acts
FLIPS = {0: (0.4, 0.45, 0.55, 0.6), 1: (0.5, 1.0, 0.75, 0.75), 2: (0.0, 0.25, 0.6, 0.65)}


@pytest.mark.parametrize("std_mode", ["global", "group"])
def test_a_changed_branch_is_corrected_where_the_ratio_left_the_clip_interval(tiny_policy, monkeypatch, std_mode):
    import digenrl.train.loss_scale as ls
    from digenrl.algo.deferred_std import Correction, corrections

    groups, ref = _setup(tiny_policy, off_policy=True)
    for k, g in enumerate(groups):
        g.rewards = torch.tensor([FLIPS[k][i] for i in g.gen_index.tolist()])
    cfg = load_config(None, [f"train.std_mode={std_mode}", "train.adv_baseline=batch", "train.adv_clip_max=5"]).train
    settings = _settings(off_policy=True)
    want, _, final = _direct(tiny_policy, groups, FLIPS, cfg, settings, ref)
    assert all(bool((final[k].abs() < 5).all()) for k in final)  # no clip
    got, _, dr = _deferred(tiny_policy, groups, FLIPS, cfg, settings, ref)
    assert _rel(got, want) < 2e-5

    flips = []

    def no_flips(*a, **k):  # the same without the branch correction fails
        c = corrections(*a, **k)
        flips.append(int(c.flipped.sum()))
        return Correction(c.final, c.held, c.kl, c.whole, torch.zeros_like(c.flipped))

    monkeypatch.setattr(ls, "corrections", no_flips)
    bad, _, _ = _deferred(tiny_policy, groups, FLIPS, cfg, settings, ref)
    assert sum(flips) == 4  # 0.55, 0.6, 0.6, 0.65
    assert _rel(bad, want) > 1e-3


@pytest.mark.parametrize("step_start", [True, False], ids=["first_round", "later_round"])
def test_deferred_round_with_recompute_and_tis(tiny_policy, step_start, monkeypatch):
    """``train.old_logprob=recompute`` with ``train.tis_cap``: logp_old from the step-start weights (the round's own
    forward, or the snapshot in a later round) and the truncated weight on the policy term give the deferred round
    the gradient of training with the final advantages; the mismatch sums agree too."""
    from dataclasses import replace

    from digenrl.train.old_logprob import attach

    attach(tiny_policy, load_config(None, ["train.old_logprob=recompute", "train.inner_epochs=2"]).train, version=0)
    groups, ref = _setup(tiny_policy, off_policy=not step_start)  # (later round: the weights moved since the start)
    g = torch.Generator().manual_seed(11)
    for k, grp in enumerate(groups):
        grp.rewards = torch.tensor([REWARDS[k][i] for i in grp.gen_index.tolist()])
        grp.log_probs = grp.log_probs + 0.05 * torch.randn(grp.log_probs.shape, generator=g)  # a biased generator
    cfg = _cfg("global", "batch")
    settings = replace(_settings(not step_start), old_logprob="recompute", tis_cap=1.02)
    import digenrl.train.chunk_loss as cl  # (train_helpers.train_group imports it when it trains)

    train = cl.train_cells
    monkeypatch.setattr(cl, "train_cells", lambda *a, **k: train(*a, **{**k, "step_start": step_start}))
    want, want_stats, _ = _direct(tiny_policy, groups, REWARDS, cfg, settings, ref)
    params = [p for p in tiny_policy.parameters() if p.requires_grad]
    tiny_policy.zero_grad(set_to_none=True)
    dr = DeferredRound(adv_options(cfg), settings, params, {ORDER[0]: REWARDS[ORDER[0]]}, step_start=step_start)
    for k in ORDER:
        for chunk in tile_grid(list(range(G)), S, 3, 1):
            dr.train(tiny_policy, groups[k], k, REWARDS[k], chunk, loss_scale=1 / S, ref_policy=ref)
    stats = dr.finish(tiny_policy, dict(enumerate(groups)), REWARDS, cfg, loss_scale=1 / S, ref_policy=ref, piece=3)
    scale = loss_scale(S, step_advantages(REWARDS, cfg).values(), cfg.filter_zero_advantage)
    got = [x * scale.commit for x in _grads(tiny_policy)]
    assert _rel(got, want) < 2e-5
    assert stats.loss == pytest.approx(want_stats.loss, rel=1e-4, abs=1e-6)
    if step_start:
        assert stats.mismatch_cells > 0 and stats.mismatch_max == pytest.approx(want_stats.mismatch_max, rel=1e-4)
    else:
        assert stats.mismatch_cells == 0
