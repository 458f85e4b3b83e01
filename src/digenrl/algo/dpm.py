"""MixGRPO-Flash's ODE outside the window: DPM-Solver++ (data prediction) steps on a flow-matching schedule, and
the compressed schedule after the window.

Flow matching as a diffusion: x_sigma = alpha x_0 + sigma eps with alpha = 1 - sigma, lambda = log(alpha / sigma),
the data prediction x0 = x - sigma v. From sigma_s to sigma_t (h = lambda_t - lambda_s)::

    first order (DDIM):    x_t = (sigma_t / sigma_s) x - alpha_t (e^{-h} - 1) x0_s
    2M, midpoint:          D0 = x0_s,  D1 = (x0_s - x0_{s-1}) / r0,  r0 = (lambda_s - lambda_{s-1}) / h
                           x_t = (sigma_t / sigma_s) x - alpha_t (e^{-h} - 1) D0 - 0.5 alpha_t (e^{-h} - 1) D1

(at sigma_t = 0 the first-order step gives x0_s, e^{-h} = 0; the 2M step is not defined there, so the last step
is first order). These are diffusers' ``DPMSolverMultistepScheduler`` updates with
``algorithm_type="dpmsolver++"``, ``solver_type="midpoint"`` and ``prediction_type="flow_prediction"``
(``tests/algo/test_dpm.py`` checks them against it). MixGRPO-Flash's use (Tencent-Hunyuan/MixGRPO,
``fastvideo/utils/sampling_utils.py``, ``run_sample_step`` with ``dpm_apply_strategy="post"``; the settings of
``scripts/finetune/finetune_flux_grpo_MixGRPO_Flash.sh``: ``dpmsolver++``, order 2, ``midpoint``, compress ratio
0.4): the steps up to the window's last SDE step L keep their sampler (Euler ODE, SDE in the window) and record
their x0 as the solver's history; the steps after L take DPM-Solver++ 2M, first order at the very last step
(``lower_order_final``) or without a previous x0; and the schedule after L is rebuilt with fewer steps::

    t_post  = linspace(1, 0, T + 1)[L + 1]                   (the unshifted time of sigma_{L+1})
    n_post  = int(max((T - L) * ratio, 1))                   (points of the new tail, sigma_{L+1} .. 0)
    sigmas' = sigmas[:L + 1] ++ shift(linspace(t_post, 0, n_post)),  shift(u) = s u / (1 + (s - 1) u)

on MixGRPO's (= DanceGRPO's) static-shift schedule ``sigmas = shift(linspace(1, 0, T + 1))`` (DigenRL's
``sampler.static_shift``), so the trajectory has L + n_post - 1 steps instead of T. One deliberate difference: the
reference's n_post = 1 (possible only near the end of a window cycle) would end the trajectory at sigma_{L+1} > 0;
here n_post is at least 2, so every trajectory ends at sigma = 0.
"""

from __future__ import annotations

import torch


def _lam(sigma: torch.Tensor) -> torch.Tensor:
    return torch.log(1 - sigma) - torch.log(sigma)


def dpmpp_first_order(x: torch.Tensor, x0: torch.Tensor, sigma_s, sigma_t) -> torch.Tensor:
    """One DPM-Solver++ first-order step from ``sigma_s`` to ``sigma_t`` given the data prediction ``x0``."""
    s, t = torch.as_tensor(sigma_s, dtype=torch.float64), torch.as_tensor(sigma_t, dtype=torch.float64)
    if float(t) == 0.0:
        return x0
    h = _lam(t) - _lam(s)
    return (float(t / s)) * x - float((1 - t) * (torch.exp(-h) - 1.0)) * x0


def dpmpp_2m(x: torch.Tensor, x0: torch.Tensor, x0_prev: torch.Tensor, sigma_prev, sigma_s, sigma_t) -> torch.Tensor:
    """One DPM-Solver++ 2M (midpoint) step from ``sigma_s`` to ``sigma_t``; ``x0_prev`` is the data prediction
    at ``sigma_prev`` (the step before)."""
    p, s, t = (torch.as_tensor(v, dtype=torch.float64) for v in (sigma_prev, sigma_s, sigma_t))
    if float(t) == 0.0:
        raise ValueError("the step to sigma = 0 is first order (lower_order_final): lambda is infinite there")
    h, h0 = _lam(t) - _lam(s), _lam(s) - _lam(p)
    d1 = (x0 - x0_prev) * float(h / h0)
    c = float((1 - t) * (torch.exp(-h) - 1.0))
    return float(t / s) * x - c * x0 - 0.5 * c * d1


def post_window_sigmas(num_steps: int, last_sde: int, shift: float, ratio: float) -> torch.Tensor:
    """MixGRPO-Flash's schedule (module docstring): float32, ``L + n_post`` + 1 values ending at 0."""
    t = torch.linspace(1, 0, num_steps + 1)
    shifted = (shift * t) / (1 + (shift - 1) * t)
    if ratio >= 1.0:
        return shifted
    n_post = max(int(max((num_steps - last_sde) * ratio, 1)), 2)
    u = torch.linspace(t[last_sde + 1].item(), 0, n_post)
    return torch.cat([shifted[: last_sde + 1], (shift * u) / (1 + (shift - 1) * u)])
