"""train.algorithm: GRPO-Guard's loss and MixGRPO's window schedule against their reference formulas, written
again here independently of ``algo.guard`` / ``algo.timesteps`` (a wrong constant there fails these)."""

from __future__ import annotations

import math

import pytest
import torch

from digenrl.algo.guard import guard_policy_loss, normalized_log_ratio
from digenrl.algo.timesteps import select_timesteps


# ---- MixGRPO ---------------------------------------------------------------------------------------------
def _mixgrpo_reference_windows(num_steps, w, tau, stride, steps):
    """MixGRPO's GRPOTrainingStates (progressive, prog_overlap, roll_back), driven as train_grpo_flux.py drives
    it: the window of each training step is taken, then the state is updated once."""
    max_t = num_steps - 2
    cur, it, out = 0, 0, []
    for _ in range(steps):
        out.append(list(range(cur, min(cur + w, max_t))))
        it += 1
        if it >= tau:
            it = 0
            cur += stride
        if cur > max_t:
            cur, it = 0, 0
    return out


@pytest.mark.parametrize("T,w,tau,stride", [(25, 4, 25, 1), (10, 2, 3, 2), (8, 3, 1, 3), (6, 2, 1, 1)])
def test_mixgrpo_window_follows_the_reference_schedule(T, w, tau, stride):
    n = 3 * (T // stride + 1) * tau  # three whole cycles of the reference
    ref = _mixgrpo_reference_windows(T, w, tau, stride, n)
    whole = 0
    for k, r in enumerate(ref):
        plan = select_timesteps(T, strategy="mixgrpo", window_size=w, shift_interval=tau, stride=stride, step=k)
        assert plan.sde_steps == plan.trained  # SDE only in the window, and the window is what is trained
        if len(r) == w:
            assert list(plan.trained) == r, k
            whole += 1
        else:  # where the reference shrinks its window at the end of a cycle the window stays whole, clamped
            assert list(plan.trained) == list(range(T - 2 - w, T - 2)), k
    assert whole > n // 2
    # MixGRPO's FLUX recipe (T 25, w 4, tau 25, s 1) for its 300 steps is the reference everywhere
    if (T, w, tau, stride) == (25, 4, 25, 1):
        assert all(len(r) == 4 for r in ref[:300])
        assert ref[0] == [0, 1, 2, 3] and ref[25] == [1, 2, 3, 4] and ref[299] == [11, 12, 13, 14]


def test_mixgrpo_window_refuses_a_window_that_does_not_fit():
    with pytest.raises(ValueError, match="window_size"):
        select_timesteps(6, strategy="mixgrpo", window_size=5)
    with pytest.raises(ValueError, match="window_shift_interval"):
        select_timesteps(6, strategy="mixgrpo", window_size=2, shift_interval=0)


# ---- GRPO-Guard ------------------------------------------------------------------------------------------
def _gauss_logp(x_next, mean, std):
    """Flow-GRPO's per-sample log-density of the SDE step (mean over the latent's elements)."""
    lp = -((x_next - mean) ** 2) / (2 * std**2) - torch.log(std) - math.log(math.sqrt(2 * math.pi))
    return lp.mean(dim=tuple(range(1, lp.ndim)))


def _guard_reference(x_next, mean, old_mean, s_t, sqrt_dt, adv, clip):
    """flow_grpo's train_sd3_GRPO_Guard.py rationorm branch, per sample (one timestep per sample)."""
    std = (s_t * sqrt_dt).reshape(-1, 1, 1, 1)
    logp, old = _gauss_logp(x_next, mean, std), _gauss_logp(x_next, old_mean, std)
    bias = (mean - old_mean).pow(2).mean(dim=(1, 2, 3)) / (2 * (sqrt_dt * s_t) ** 2)
    ratio = torch.exp((logp - old + bias) * (sqrt_dt * s_t))
    loss = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1.0 - clip, 1.0 + clip))
    return loss / sqrt_dt**2, ratio


def _cells(seed=0, n=6, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    shape = (n, 4, 3, 3)
    sigma = torch.rand(n, generator=g, dtype=torch.float64) * 0.8 + 0.1
    dt = -torch.rand(n, generator=g, dtype=torch.float64) * 0.09 - 0.01
    s_t = 0.7 * torch.sqrt(sigma / (1 - sigma))
    sqrt_dt = torch.sqrt(-dt)
    old_mean = torch.randn(shape, generator=g, dtype=torch.float64)
    eps = torch.randn(shape, generator=g, dtype=torch.float64)
    x_next = old_mean + (s_t * sqrt_dt).reshape(-1, 1, 1, 1) * eps
    mean = old_mean + scale * torch.randn(shape, generator=g, dtype=torch.float64)
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    return dict(x_next=x_next, mean=mean, old_mean=old_mean, s_t=s_t, sqrt_dt=sqrt_dt, dt=dt, eps=eps, adv=adv)


@pytest.mark.parametrize("scale", [0.0, 1e-4, 0.05])
def test_grpo_guard_loss_matches_the_reference_formula(scale):
    c = _cells(scale=scale)
    std = (c["s_t"] * c["sqrt_dt"]).reshape(-1, 1, 1, 1)
    logp, old = _gauss_logp(c["x_next"], c["mean"], std), _gauss_logp(c["x_next"], c["old_mean"], std)
    clip = 2e-6 if scale < 1e-3 else 0.2  # flow_grpo's recipe clip, and one that the larger moves exceed
    got, stats = guard_policy_loss(logp, old, c["mean"], c["old_mean"], std, c["dt"], c["adv"], clip)
    want, _ = _guard_reference(c["x_next"], c["mean"], c["old_mean"], c["s_t"], c["sqrt_dt"], c["adv"], clip)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert float(stats.approx_kl) == pytest.approx(float(0.5 * ((logp - old) ** 2).mean()), rel=1e-9, abs=1e-15)
    if scale == 0.0:  # on-policy: the normalised ratio is exactly 1 and the loss -A / (-dt)
        torch.testing.assert_close(got, -c["adv"] / (-c["dt"]), rtol=1e-12, atol=1e-12)


def test_grpo_guard_ratio_is_centred_and_on_one_scale():
    """RatioNorm's log-ratio is mean(eps (mu_theta - mu_old)) whatever the step's std: the paper's point."""
    c = _cells(scale=0.05)
    std = (c["s_t"] * c["sqrt_dt"]).reshape(-1, 1, 1, 1)
    logp, old = _gauss_logp(c["x_next"], c["mean"], std), _gauss_logp(c["x_next"], c["old_mean"], std)
    lr = normalized_log_ratio(logp, old, c["mean"], c["old_mean"], std)
    want = (c["eps"] * (c["mean"] - c["old_mean"])).mean(dim=(1, 2, 3))
    torch.testing.assert_close(lr, want, rtol=1e-9, atol=1e-12)
    # the raw log-ratio is biased below 0 by mean((mu_theta - mu_old)^2) / (2 std^2)
    bias = ((c["mean"] - c["old_mean"]) ** 2).mean(dim=(1, 2, 3)) / (2 * std.reshape(-1) ** 2)
    torch.testing.assert_close((logp - old) + bias, want / std.reshape(-1), rtol=1e-9, atol=1e-12)


def test_grpo_guard_gradient_is_the_reference_gradient():
    c = _cells(scale=1e-3)
    std = (c["s_t"] * c["sqrt_dt"]).reshape(-1, 1, 1, 1)
    m1 = c["mean"].clone().requires_grad_(True)
    m2 = c["mean"].clone().requires_grad_(True)
    got, _ = guard_policy_loss(_gauss_logp(c["x_next"], m1, std), _gauss_logp(c["x_next"], c["old_mean"], std), m1,
                               c["old_mean"], std, c["dt"], c["adv"], 1e-4)
    want, _ = _guard_reference(c["x_next"], m2, c["old_mean"], c["s_t"], c["sqrt_dt"], c["adv"], 1e-4)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(m1.grad, m2.grad, rtol=1e-9, atol=1e-14)
    assert float(m1.grad.abs().max()) > 0
