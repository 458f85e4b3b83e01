"""MixGRPO-Flash's ODE: DPM-Solver++ steps against diffusers' DPMSolverMultistepScheduler, and the compressed
schedule after the window against MixGRPO's formula (written again here)."""

from __future__ import annotations

import pytest
import torch

from digenrl.algo.dpm import dpmpp_2m, dpmpp_first_order, post_window_sigmas


def _diffusers_scheduler(sigmas):
    diffusers = pytest.importorskip("diffusers")
    s = diffusers.DPMSolverMultistepScheduler(algorithm_type="dpmsolver++", solver_order=2, solver_type="midpoint",
                                              prediction_type="flow_prediction", use_flow_sigmas=True)
    s.sigmas = sigmas.to(torch.float64)
    return s


def test_dpmpp_steps_match_diffusers():
    g = torch.Generator().manual_seed(0)
    sigmas = torch.tensor([1.0, 0.9, 0.7, 0.45, 0.2, 0.0], dtype=torch.float64)
    sched = _diffusers_scheduler(sigmas)
    x = torch.randn(2, 4, 3, 3, generator=g, dtype=torch.float64)
    x0_prev, x0 = (torch.randn(2, 4, 3, 3, generator=g, dtype=torch.float64) for _ in range(2))
    for i in (1, 2, 3):
        sched._step_index = i
        want1 = sched.dpm_solver_first_order_update(x0, sample=x)
        want2 = sched.multistep_dpm_solver_second_order_update([x0_prev, x0], sample=x)
        torch.testing.assert_close(dpmpp_first_order(x, x0, sigmas[i], sigmas[i + 1]), want1, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(dpmpp_2m(x, x0, x0_prev, sigmas[i - 1], sigmas[i], sigmas[i + 1]), want2,
                                   rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dpmpp_first_order(x, x0, sigmas[4], 0.0), x0)  # the last step lands on x0
    with pytest.raises(ValueError, match="first order"):
        dpmpp_2m(x, x0, x0_prev, sigmas[3], sigmas[4], 0.0)


def test_dpmpp_2m_integrates_a_linear_flow_exactly():
    """A straight flow (x0 fixed): every DPM-Solver++ step is exact, whatever the step size."""
    x0, eps = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)
    xs = lambda s: (1 - s) * x0 + s * eps  # noqa: E731
    torch.testing.assert_close(dpmpp_first_order(xs(0.8), x0, 0.8, 0.3), xs(0.3))
    torch.testing.assert_close(dpmpp_2m(xs(0.6), x0, x0, 0.9, 0.6, 0.1), xs(0.1))


@pytest.mark.parametrize("T,L,shift,ratio", [(25, 3, 3.0, 0.4), (25, 14, 3.0, 0.4), (10, 2, 1.0, 0.5), (8, 4, 3.0, 1.0)])
def test_post_window_schedule_is_mixgrpos(T, L, shift, ratio):
    def sd3_time_shift(s, t):
        return (s * t) / (1 + (s - 1) * t)

    full = sd3_time_shift(shift, torch.linspace(1, 0, T + 1))
    n = int(max((T + 1 - 1 - L) * ratio, 1))
    post = sd3_time_shift(shift, torch.linspace(torch.linspace(1, 0, T + 1)[L + 1].item(), 0, n))
    want = torch.cat([full[: L + 1], post])
    got = post_window_sigmas(T, L, shift, ratio)
    torch.testing.assert_close(got, want)
    assert got[-1] == 0 and torch.all(got[1:] < got[:-1])
    assert len(got) - 1 == (T if ratio == 1.0 else L + n - 1 + 1)  # steps: L + 1 kept, n - 1 after
    if (T, L, ratio) == (25, 3, 0.4):
        assert len(got) - 1 == 4 + 7  # the Flash recipe's first window: 11 steps instead of 25


def test_post_window_schedule_keeps_two_points():
    """Where MixGRPO's n_post would be 1 (its trajectory would stop at sigma_{L+1} > 0) two points are kept."""
    got = post_window_sigmas(25, 22, 3.0, 0.4)  # (25 - 22) * 0.4 = 1.2
    assert got[-1] == 0 and len(got) == 23 + 2
