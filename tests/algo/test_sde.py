"""SDE step and sigma schedules against independent oracles (torch.distributions, diffusers)."""

import math

import pytest
import torch

from digenrl.algo.sde import sde_step_with_logprob
from digenrl.algo.sigmas import flow_match_sigmas, resolution_shift_mu


@pytest.mark.parametrize("kind", ["flow_grpo", "dance"])
def test_log_prob_matches_torch_normal(kind):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, 4, 4, generator=g, dtype=torch.float64)
    v = torch.randn(3, 2, 4, 4, generator=g, dtype=torch.float64)
    out = sde_step_with_logprob(x, v, 0.7, 0.6, noise_level=0.7, kind=kind, generator=g)
    normal = torch.distributions.Normal(out.mean, out.std.expand_as(out.mean))
    ref = normal.log_prob(out.prev_sample).mean(dim=(1, 2, 3))
    torch.testing.assert_close(out.log_prob, ref, rtol=1e-10, atol=1e-10)
    # evaluating a given transition gives the same value
    again = sde_step_with_logprob(x, v, 0.7, 0.6, noise_level=0.7, kind=kind, prev_sample=out.prev_sample)
    torch.testing.assert_close(again.log_prob, ref, rtol=1e-10, atol=1e-10)


def test_flow_grpo_std_and_sigma_one():
    x = torch.zeros(1, 1, 2, 2, dtype=torch.float64)
    v = torch.ones_like(x)
    a = 0.7
    # ordinary step: s_t = a sqrt(sigma / (1 - sigma)), std = s_t sqrt(-dt)
    out = sde_step_with_logprob(x, v, 0.5, 0.4, noise_level=a, prev_sample=x)
    assert out.std.item() == pytest.approx(a * math.sqrt(0.5 / 0.5) * math.sqrt(0.1))
    # sigma == 1 uses sigma' in the (1 - sigma) factor
    out = sde_step_with_logprob(x, v, 1.0, 0.9, noise_level=a, prev_sample=x)
    assert out.std.item() == pytest.approx(a * math.sqrt(1.0 / 0.1) * math.sqrt(0.1))
    assert torch.isfinite(out.log_prob).all()


def test_dance_equals_score_form():
    """DanceGRPO writes the drift via the score of x0_hat; it must equal our closed form."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 5, generator=g, dtype=torch.float64)
    v = torch.randn(2, 3, 5, generator=g, dtype=torch.float64)
    sigma, sigma_next, eta = 0.8, 0.65, 0.3
    out = sde_step_with_logprob(x, v, sigma, sigma_next, noise_level=eta, kind="dance", prev_sample=x)
    dsigma = sigma_next - sigma
    x0 = x - sigma * v
    score = -(x - x0 * (1 - sigma)) / sigma**2
    ref_mean = x + dsigma * v - 0.5 * eta**2 * score * dsigma
    torch.testing.assert_close(out.mean, ref_mean)
    assert out.std.flatten()[0].item() == pytest.approx(eta * math.sqrt(-dsigma))


def test_noise_level_zero_is_diffusers_euler_step():
    from diffusers import FlowMatchEulerDiscreteScheduler

    sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
    sched.set_timesteps(6)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 4, 8, 8, generator=g)
    ours = x.clone()
    for i, t in enumerate(sched.timesteps):
        v = torch.tanh(x * 0.3 + i)  # any velocity field
        x = sched.step(v, t, x).prev_sample
        out = sde_step_with_logprob(ours, torch.tanh(ours * 0.3 + i), sched.sigmas[i], sched.sigmas[i + 1], noise_level=0.0)
        ours = out.prev_sample
        assert torch.all(out.log_prob == 0)
    torch.testing.assert_close(ours, x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("steps,shift", [(1, 1.0), (10, 1.0), (10, 3.0), (28, 3.0), (40, 5.0)])
def test_sigmas_match_diffusers_static_shift(steps, shift):
    from diffusers import FlowMatchEulerDiscreteScheduler

    sched = FlowMatchEulerDiscreteScheduler(shift=shift)
    sched.set_timesteps(steps)
    torch.testing.assert_close(flow_match_sigmas(steps, shift=shift), sched.sigmas, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("seq_len", [256, 1024, 4096])
def test_sigmas_match_diffusers_dynamic_shift(seq_len):
    import numpy as np
    from diffusers import FlowMatchEulerDiscreteScheduler

    sched = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15)
    mu = resolution_shift_mu(seq_len)
    # FLUX pipeline passes the linear grid explicitly
    sched.set_timesteps(sigmas=np.linspace(1.0, 1 / 20, 20), mu=mu)
    ours = flow_match_sigmas(20, mu=mu, grid="linear")
    torch.testing.assert_close(ours, sched.sigmas, rtol=1e-6, atol=1e-6)
    sched.set_timesteps(20, mu=mu)
    torch.testing.assert_close(flow_match_sigmas(20, mu=mu), sched.sigmas, rtol=1e-6, atol=1e-6)


def test_bad_kind_and_steps():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="sde kind"):
        sde_step_with_logprob(x, x, 0.5, 0.4, noise_level=0.5, kind="ddim")
    with pytest.raises(ValueError, match="num_steps"):
        flow_match_sigmas(0)
