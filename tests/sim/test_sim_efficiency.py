"""Efficiencies fitted to cited public measurements: the fit, the regression fallback, the residuals."""

from __future__ import annotations

import math

import pytest

from digenrl.sim.efficiency import MEASUREMENTS, efficiency_for, plateau, residuals
from digenrl.sim.presets import H100, L40S, MODELS


def test_every_measurement_is_cited_and_positive():
    assert len({m.gpu.name for m in MEASUREMENTS}) >= 4
    for m in MEASUREMENTS:
        assert m.source and m.seconds > 0 and m.model in MODELS


def test_h100_plateau_is_the_geometric_mean_of_its_measured_utilisations():
    # by hand: MFU = F / ((t - vae) * peak) with F from the per-stream FLOPs, divided by x / (x + 512)
    vals = []
    for m in MEASUREMENTS:
        if m.gpu is not H100:
            continue
        lf = 1 + (m.frames - 1) // 4 if m.frames > 1 else 1
        x = lf * (m.height // 16) * (m.width // 16)
        F = m.steps * m.forwards_per_step * MODELS[m.model].archi.forward_flops(x, m.text_tokens)
        vae = MODELS[m.model].spec.vae_flop_per_px * m.width * m.height * m.frames / (989e12 * 0.35)
        vals.append(F / ((m.seconds - vae) * 989e12) / (x / (x + 512)))
    assert len(vals) == 3
    assert plateau(H100)[0] == pytest.approx(math.exp(sum(map(math.log, vals)) / 3))
    assert efficiency_for(H100)(1e9) == pytest.approx(plateau(H100)[0], rel=1e-6)


def test_unmeasured_gpu_uses_the_regression_and_residuals_cover_every_measurement():
    p, how = plateau(L40S)
    assert "regression" in how and 0.05 < p <= 0.9
    res = residuals()
    assert len(res) == len(MEASUREMENTS)
    for r in res:
        # a GPU kind's own fit prices each of its measurements within 10 %
        assert abs(r["residual"]) < 0.10, r
        assert r["loo_predicted_s"] > 0
