"""Branches that only a non-default value of a key reaches (issue 40): for each, a test whose expected value
changes with that value, computed here from the formula (no import of the code it checks for the expectation).
``scripts/mutants.py`` keeps one single-point mutant per branch and runs this file against it.

* ``train.clip_range_low`` != ``clip_range_high``: the clip's lower bound and ``clipfrac_lt_one``;
* ``train.std_mode=global`` with ``train.adv_std_unbiased=true``: the step's std with n - 1;
* trained timesteps that do not start at the first step (``train.timestep_strategy=window``): each trained
  position's sigma is its own denoising step's;
* ``train.ema_warmup=false`` and ``train.ema_every`` > 1;
* a resume restores the torch random stream (``model.lora.dropout`` > 0 draws from it in training);
* ``runtime.max_stale_fraction`` is part of a step's math in ``full`` mode only;
* ``train.cfg_detach_uncond=true``: no gradient through the unconditional CFG branch.
"""

from __future__ import annotations

import copy

import pytest
import torch

from train_helpers import sde_reference


# ---- the asymmetric clip ---------------------------------------------------------------------------------------
def test_asymmetric_clip_range_uses_each_bound_on_its_side():
    """loss = max(-A r, -A clip(r, 1 - low, 1 + high)); with A < 0 a ratio below 1 - low is raised to 1 - low,
    with A > 0 one above 1 + high is cut to 1 + high. clipfrac_lt_one = mean(1 - r > low)."""
    from digenrl.algo.loss import clipped_policy_loss

    low, high = 0.1, 0.3
    r = torch.tensor([0.5, 0.85, 0.95, 1.2, 1.5, 1.5])
    A = torch.tensor([-1.0, -2.0, -1.0, 1.0, 1.0, 2.0])
    loss, st = clipped_policy_loss(torch.log(r), torch.zeros(6), A, 0.2, clip_low=low, clip_high=high)
    want = torch.maximum(-A * r, -A * r.clamp(1 - low, 1 + high))
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(loss, torch.tensor([0.9, 1.8, 0.95, -1.2, -1.3, -2.6]))  # by hand
    assert float(st.clipfrac_lt_one) == pytest.approx(2 / 6)  # 0.5 and 0.85 (1 - r > 0.1)
    assert float(st.clipfrac_gt_one) == pytest.approx(2 / 6)  # the two 1.5 (r - 1 > 0.3)


# ---- the unbiased std in global mode ---------------------------------------------------------------------------
def test_global_std_is_unbiased_when_asked():
    """A_i = (r_i - mean_group) / (std_step + eps) with std_step over every reward of the step, n - 1 when
    train.adv_std_unbiased (DanceGRPO's torch std), n otherwise (Flow-GRPO's numpy std)."""
    from digenrl.algo.advantage import group_advantages

    r = torch.tensor([0.1, 0.4, 0.2, 0.9, 0.5, 0.3], dtype=torch.float64)
    ids = torch.tensor([0, 0, 0, 1, 1, 1])
    eps = 1e-4
    n = len(r)
    mean_all = sum(r.tolist()) / n
    ss = sum((x - mean_all) ** 2 for x in r.tolist())
    for unbiased, denom in ((True, n - 1), (False, n)):
        std = (ss / denom) ** 0.5
        means = [sum(r[:3].tolist()) / 3] * 3 + [sum(r[3:].tolist()) / 3] * 3
        want = torch.tensor([(x - m) / (std + eps) for x, m in zip(r.tolist(), means)], dtype=torch.float64)
        got, _ = group_advantages(r, ids, std_mode="global", unbiased=unbiased, eps=eps, adv_clip_max=10.0)
        torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-7)


# ---- trained timesteps that do not start at step 0 --------------------------------------------------------------
def test_a_window_trains_each_position_at_its_own_step(tiny_policy):
    """train.timestep_strategy=window with a window that starts at step >= 2: trained position j is denoising
    step trained_steps[j], whose sigma and sigma' the loss uses (the reference here indexes the schedule by the
    step, not by the position)."""
    from digenrl.algo.timesteps import select_timesteps
    from digenrl.rollout.sampler import SamplerSettings
    from digenrl.tasks.digits import DigitsTask
    from digenrl.train.chunk_loss import LossSettings, train_cells
    from digenrl.train.step_math import assign_advantages, generate

    plan = select_timesteps(6, strategy="window", window_size=2, window_range=(2, 5), seed=0, step=0)
    assert plan.trained[0] >= 2
    n, clip = 4, 1e-3
    prompts = DigitsTask().train_prompts(0, 1, seed=0)
    batch = generate(tiny_policy, prompts * n, list(range(n)), step=0, run_seed=1, version=0,
                     settings=SamplerSettings(num_steps=6, noise_level=0.7), plan=plan)
    batch.rewards = torch.tensor([0.1, 0.8, 0.3, 0.6])
    assign_advantages(batch)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in tiny_policy.parameters():
            p.add_(3e-3 * torch.randn(p.shape, generator=g))
    ref = copy.deepcopy(tiny_policy)
    cond = ref.encode_prompts(batch.prompts)
    A = batch.advantages
    for j, step in enumerate(plan.trained):
        s0, s1 = float(batch.sigmas[step]), float(batch.sigmas[step + 1])
        x = batch.latents[:, j]
        _, _, lp = sde_reference(x, ref(x, torch.full((n,), s0), cond), s0, s1, 0.7, batch.next_latents[:, j])
        ratio = torch.exp(lp - batch.log_probs[:, j])
        torch.maximum(-A * ratio, -A * ratio.clamp(1 - clip, 1 + clip)).sum().backward()
    train_cells(tiny_policy, batch, [(k, j) for k in range(n) for j in range(2)],
                settings=LossSettings(clip_range=clip), loss_scale=1.0)
    for p, q in zip(tiny_policy.parameters(), ref.parameters()):
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-7)


# ---- EMA options -----------------------------------------------------------------------------------------------
def _ema_run(decay, every, warmup, steps):
    from digenrl.train.ema import ParamEMA

    w = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        w.weight.fill_(0.0)
    ema = ParamEMA(w, decay, every=every, warmup=warmup)
    for k in range(1, steps + 1):
        with torch.no_grad():
            w.weight.fill_(float(k))  # the weights after optimizer step k
        ema.update()
    return float(ema.shadow["weight"])


@pytest.mark.parametrize("every,warmup", [(1, False), (3, True), (3, False), (1, True)])
def test_ema_decay_and_interval(every, warmup):
    """Flow-GRPO's EMAModuleWrapper: after optimizer step n (n = 1, 2, ...) the shadow moves when
    (n + 1) % every == 0, s <- s + (1 - d_n)(theta - s), d_n = min((1 + n) / (10 + n), decay) with the warm-up,
    decay without it."""
    decay, steps, s = 0.9, 7, 0.0
    for n in range(1, steps + 1):
        if (n + 1) % every == 0:
            d = min((1 + n) / (10 + n), decay) if warmup else decay
            s = s + (1 - d) * (n - s)
    assert _ema_run(decay, every, warmup, steps) == pytest.approx(s, rel=1e-6)


# ---- resume: the random stream -----------------------------------------------------------------------------------
def test_resume_restores_the_torch_random_stream(tiny_policy):
    from digenrl.config import load_config
    from digenrl.train import checkpoint as ckpt
    from digenrl.train.context import build_context

    cfg = load_config(None, ["steps=1"])
    ctx = build_context(cfg, policy=tiny_policy)
    torch.rand(17)  # the stream moved on since the seed
    data = ckpt.pack_train_state(ctx, step=1)
    want = torch.rand(5)  # what the run draws next
    torch.manual_seed(1234)  # a fresh process
    other = build_context(cfg, policy=copy.deepcopy(tiny_policy))
    torch.rand(3)
    ckpt.restore_train_state(other, ckpt.unpack(data))
    assert torch.equal(torch.rand(5), want)


# ---- resume: runtime.max_stale_fraction in full mode -----------------------------------------------------------
def test_stale_cap_is_math_in_full_mode_only():
    from digenrl.config import ConfigError, load_config
    from digenrl.train.resume_config import check_resume_config

    for mode, refused in (("full", True), ("gap_tsp_tag", False)):
        saved = load_config(None, [f"runtime.mode={mode}"]).model_dump(mode="json")
        now = load_config(None, [f"runtime.mode={mode}", "runtime.max_stale_fraction=0.5"])
        if refused:
            with pytest.raises(ConfigError, match=r"runtime\.max_stale_fraction"):
                check_resume_config(saved, now)
        else:
            check_resume_config(saved, now)


# ---- CFG: no gradient through the unconditional branch ----------------------------------------------------------
@pytest.mark.parametrize("detach", [True, False])
def test_cfg_detach_uncond(tiny_policy, detach):
    """v = v_u + w (v_c - v_u); with train.cfg_detach_uncond the gradient of sum(v) is w d v_c (v_u a constant),
    else (1 - w) d v_u + w d v_c."""
    from digenrl.models.base import guided_velocity
    from digenrl.tasks.digits import DigitsTask

    w, n = 3.0, 2
    prompts = DigitsTask().train_prompts(0, n, seed=0)
    x, sigma = torch.randn(n, 1, 8, 16, generator=torch.Generator().manual_seed(0)), torch.full((n,), 0.6)
    ref = copy.deepcopy(tiny_policy)
    guided_velocity(tiny_policy, x, sigma, tiny_policy.encode_prompts(prompts), w, detach_uncond=detach).sum().backward()
    v_c = ref(x, sigma, ref.encode_prompts(prompts))
    v_u = ref(x, sigma, ref.null_cond(n))
    (w * v_c.sum() + (0.0 if detach else (1 - w) * v_u.sum())).backward()
    for p, q in zip(tiny_policy.parameters(), ref.parameters()):
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
