"""Flow-GRPO / DanceGRPO conventions, each against its formula written out here.

Sources: Flow-GRPO ``sd3_sde_with_logprob.py`` (std_dev_t, the cps surrogate), ``train_sd3.py`` (KL, int timestep
count, clipfrac_gt_one / lt_one), ``stat_tracking.py`` and ``train_sd3.py`` (advantages), the Fast pipelines
(``start = randint(lo, hi - size)``); DanceGRPO ``train_grpo_flux.py`` (unbiased group std + 1e-8).
"""

import math

import numpy as np
import pytest
import torch

from digenrl.algo.advantage import group_advantages
from digenrl.algo.loss import clipped_policy_loss, reference_kl
from digenrl.algo.sde import sde_step_with_logprob
from digenrl.algo.timesteps import select_timesteps


def _xv(seed=0, shape=(3, 2, 4, 4)):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64), torch.randn(shape, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("sigma,sigma_next", [(0.7, 0.6), (1.0, 0.9), (0.2, 0.0)])
def test_std_dev_t_is_flow_grpo_s_t(sigma, sigma_next):
    x, v = _xv()
    a = 0.7
    out = sde_step_with_logprob(x, v, sigma, sigma_next, noise_level=a, prev_sample=x)
    denom = sigma_next if sigma == 1.0 else sigma  # flow_grpo: where(sigma == 1, sigmas[1], sigma)
    s_t = a * math.sqrt(sigma / (1 - denom))
    assert out.std_dev_t.flatten()[0].item() == pytest.approx(s_t, rel=1e-12)
    assert out.std.flatten()[0].item() == pytest.approx(s_t * math.sqrt(sigma - sigma_next), rel=1e-12)
    dance = sde_step_with_logprob(x, v, sigma, sigma_next, noise_level=0.3, kind="dance", prev_sample=x)
    assert dance.std_dev_t.flatten()[0].item() == pytest.approx(0.3)


def test_kl_in_flow_grpo_units_and_exact_option():
    x, v = _xv(1)
    v_ref = v + 0.05 * _xv(2)[1]
    sigma, sigma_next, a = 0.8, 0.7, 0.7
    out = sde_step_with_logprob(x, v, sigma, sigma_next, noise_level=a, prev_sample=x)
    ref = sde_step_with_logprob(x, v_ref, sigma, sigma_next, noise_level=a, prev_sample=x)
    s_t = a * math.sqrt(sigma / (1 - sigma))
    dt = sigma_next - sigma
    written = ((out.mean - ref.mean) ** 2).mean(dim=(1, 2, 3)) / (2 * s_t**2)  # train_sd3.py kl_loss
    torch.testing.assert_close(reference_kl(out, ref.mean), written)
    torch.testing.assert_close(reference_kl(out, ref.mean, "exact"), written / (-dt))
    std = s_t * math.sqrt(-dt)
    exact = torch.distributions.kl_divergence(torch.distributions.Normal(out.mean, std),
                                              torch.distributions.Normal(ref.mean, std)).mean(dim=(1, 2, 3))
    torch.testing.assert_close(reference_kl(out, ref.mean, "exact"), exact)
    with pytest.raises(ValueError, match="kl_form"):
        reference_kl(out, ref.mean, "nats")


def test_cps_log_prob_is_flow_grpo_surrogate():
    x, v = _xv(3)
    sigma, sigma_next, a = 0.6, 0.45, 0.5
    out = sde_step_with_logprob(x, v, sigma, sigma_next, noise_level=a, kind="cps", generator=torch.Generator().manual_seed(4))
    std = sigma_next * math.sin(a * math.pi / 2)
    mean = (x - sigma * v) * (1 - sigma_next) + (x + v * (1 - sigma)) * math.sqrt(sigma_next**2 - std**2)
    torch.testing.assert_close(out.mean, mean)
    torch.testing.assert_close(out.log_prob, -((out.prev_sample - mean) ** 2).mean(dim=(1, 2, 3)))
    assert out.std_dev_t.flatten()[0].item() == pytest.approx(std)


@pytest.mark.parametrize("T,f", [(10, 0.99), (10, 0.25), (10, 0.35), (10, 0.5), (100, 0.29), (6, 1.0)])
def test_trained_count_is_int_of_fraction(T, f):
    assert select_timesteps(T, fraction=f).trained == tuple(range(int(T * f)))


def test_fraction_099_leaves_out_last_step_and_zero_count_refused():
    assert 9 not in select_timesteps(10, fraction=0.99).trained
    with pytest.raises(ValueError, match="timestep_fraction"):
        select_timesteps(10, fraction=0.05)


def test_window_range_is_sde_window_range():
    """Flow-GRPO Fast: start = randint(lo, hi - size); the whole window lies in [lo, hi)."""
    lo, hi, size = 0, 5, 2
    starts = {select_timesteps(10, strategy="window", window_size=size, window_range=(lo, hi), seed=7, step=s).trained[0]
              for s in range(300)}
    assert starts == set(range(lo, hi - size + 1))
    plan = select_timesteps(10, strategy="window", window_size=size, window_range=(lo, hi), seed=7, step=0)
    assert plan.trained == tuple(range(plan.trained[0], plan.trained[0] + size)) == plan.sde_steps
    default = {select_timesteps(10, strategy="window", window_size=3, seed=1, step=s).trained[-1] for s in range(300)}
    assert max(default) == 8  # default range (0, T - 1): never the last step
    with pytest.raises(ValueError, match="window_range"):
        select_timesteps(10, strategy="window", window_size=3, window_range=(4, 6))


def test_asymmetric_clip_and_clipfrac_directions():
    ratio = torch.tensor([0.5, 0.95, 1.0, 1.05, 1.5])
    logp = torch.log(ratio)
    adv = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0])
    loss, st = clipped_policy_loss(logp, torch.zeros(5), adv, 0.2, clip_low=0.1, clip_high=0.3)
    written = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - 0.1, 1 + 0.3))
    torch.testing.assert_close(loss, written)
    assert st.clipfrac_gt_one.item() == pytest.approx(1 / 5)  # 1.5 - 1 > 0.3
    assert st.clipfrac_lt_one.item() == pytest.approx(1 / 5)  # 1 - 0.5 > 0.1
    assert st.clipfrac.item() == pytest.approx(2 / 5)  # |r - 1| > 0.2, as Flow-GRPO logs it


def test_advantages_batch_baseline_and_dance_unbiased():
    r = torch.tensor([0.1, 0.5, 0.9, 0.3, 0.3, 0.8])
    gid = torch.tensor([0, 0, 0, 1, 1, 1])
    rn = r.double().numpy()
    # Flow-GRPO per_prompt_stat_tracking=False: (r - mean) / (std + 1e-4) over the whole batch (numpy std)
    adv, _ = group_advantages(r, gid, std_mode="global", baseline="batch")
    np.testing.assert_allclose(adv.numpy(), (rn - rn.mean()) / (rn.std() + 1e-4), rtol=1e-6)
    # DanceGRPO use_group: (r - group mean) / (torch std (unbiased) + 1e-8)
    adv, _ = group_advantages(r, gid, unbiased=True, eps=1e-8)
    for g in (0, 1):
        rg = rn[3 * g: 3 * g + 3]
        np.testing.assert_allclose(adv.numpy()[3 * g: 3 * g + 3], (rg - rg.mean()) / (rg.std(ddof=1) + 1e-8), rtol=1e-6)
