"""DiffusionNFT's loss against the reference formula (NVlabs/DiffusionNFT scripts/train_nft_sd3.py), written again
here in plain torch independently of ``algo.nft``: a wrong beta, weighting, optimality map or x0 prediction fails."""

from __future__ import annotations

import pytest
import torch

from digenrl.algo import nft
from digenrl.algo.timesteps import nft_plan, nft_train_count


def _reference_loss(v, v_old, xt, x0, t, adv, beta, clip, weighted=True):
    """The reference's training-loop lines, per sample (mean over the latent's elements); ``weighted=False``:
    without its adaptive weight (a wrong variant the tests must tell apart)."""
    r = torch.clamp((torch.clamp(adv, -clip, clip) / clip) / 2.0 + 0.5, 0, 1)
    te = t.view(-1, 1, 1, 1)
    pos_v = beta * v + (1 - beta) * v_old
    neg_v = (1.0 + beta) * v_old - beta * v
    x0p = xt - te * pos_v
    wp = (x0p.double() - x0.double()).abs().mean(dim=(1, 2, 3), keepdim=True).clip(min=0.00001).detach()
    wp = wp if weighted else torch.ones_like(wp)
    lp = ((x0p - x0) ** 2 / wp).mean(dim=(1, 2, 3))
    x0n = xt - te * neg_v
    wn = (x0n.double() - x0.double()).abs().mean(dim=(1, 2, 3), keepdim=True).clip(min=0.00001).detach()
    wn = wn if weighted else torch.ones_like(wn)
    ln = ((x0n - x0) ** 2 / wn).mean(dim=(1, 2, 3))
    return (r * lp / beta + (1.0 - r) * ln / beta) * clip


def _tensors(seed=0, n=6):
    g = torch.Generator().manual_seed(seed)
    shape = (n, 3, 4, 4)
    x0 = torch.randn(shape, generator=g, dtype=torch.float64)
    eps = torch.randn(shape, generator=g, dtype=torch.float64)
    t = torch.rand(n, generator=g, dtype=torch.float64) * 0.9 + 0.05
    xt = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * eps
    v_old = eps - x0 + 0.3 * torch.randn(shape, generator=g, dtype=torch.float64)
    v = v_old + 0.2 * torch.randn(shape, generator=g, dtype=torch.float64)
    adv = torch.tensor([-5.0, -1.3, 0.0, 0.4, 2.5, 5.0], dtype=torch.float64)[:n]
    return dict(x0=x0, eps=eps, t=t, xt=xt, v_old=v_old, v=v, adv=adv)


@pytest.mark.parametrize("beta", [1.0, 0.1])
def test_nft_loss_matches_the_reference_formula(beta):
    c = _tensors()
    r = nft.optimality(c["adv"], 5.0)
    got, stats = nft.nft_loss(c["v"], c["v_old"], c["xt"], c["x0"], c["t"], r, beta=beta, adv_clip_max=5.0)
    want = _reference_loss(c["v"], c["v_old"], c["xt"], c["x0"], c["t"], c["adv"], beta, 5.0)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert float(stats.old_deviate) > 0
    # a wrong constant is seen: another beta, no adaptive weight, the other advantage map
    other = _reference_loss(c["v"], c["v_old"], c["xt"], c["x0"], c["t"], c["adv"], 0.5 if beta == 1.0 else 1.0, 5.0)
    assert not torch.allclose(got, other, rtol=1e-3)
    unweighted = _reference_loss(c["v"], c["v_old"], c["xt"], c["x0"], c["t"], c["adv"], beta, 5.0, weighted=False)
    assert not torch.allclose(got, unweighted, rtol=1e-3)
    torch.testing.assert_close(nft.optimality(c["adv"], 5.0), c["adv"] / 10.0 + 0.5)
    assert nft.optimality(torch.tensor([-7.0, 7.0]), 5.0).tolist() == [0.0, 1.0]


def test_nft_implicit_velocities_and_forward_process():
    c = _tensors()
    pos, neg = nft.implicit_velocities(c["v"], c["v_old"], 0.1)
    torch.testing.assert_close(pos, 0.1 * c["v"] + 0.9 * c["v_old"])
    torch.testing.assert_close(neg, 1.1 * c["v_old"] - 0.1 * c["v"])
    torch.testing.assert_close(0.5 * (pos + neg), c["v_old"])  # symmetric around the old velocity
    torch.testing.assert_close(nft.forward_noise(c["x0"], c["eps"], c["t"]), c["xt"])


@pytest.mark.parametrize("beta", [1.0, 0.1])
def test_nft_gradient_is_the_reference_gradient(beta):
    c = _tensors(1)
    v1 = c["v"].clone().requires_grad_(True)
    v2 = c["v"].clone().requires_grad_(True)
    nft.nft_loss(v1, c["v_old"], c["xt"], c["x0"], c["t"], nft.optimality(c["adv"], 5.0), beta=beta)[0].sum().backward()
    _reference_loss(v2, c["v_old"], c["xt"], c["x0"], c["t"], c["adv"], beta, 5.0).sum().backward()
    torch.testing.assert_close(v1.grad, v2.grad, rtol=1e-10, atol=1e-14)


def test_nft_on_policy_gradient_is_advantage_weighted_flow_matching():
    """With v_old = v (old = the step's weights) beta and c cancel: dL/dv = A dE/dv, E = mean((x0_hat - x0)^2) / w."""
    c = _tensors(2)
    for beta in (1.0, 0.1):
        v = c["v"].clone().requires_grad_(True)
        r = nft.optimality(c["adv"], 5.0)
        nft.nft_loss(v, v.detach(), c["xt"], c["x0"], c["t"], r, beta=beta)[0].sum().backward()
        e = c["xt"] - c["t"].view(-1, 1, 1, 1) * c["v"] - c["x0"]
        w = e.abs().mean(dim=(1, 2, 3), keepdim=True)
        want = c["adv"].view(-1, 1, 1, 1) * (-2 * c["t"].view(-1, 1, 1, 1) * e / w) / e[0].numel()
        torch.testing.assert_close(v.grad, want, rtol=1e-9, atol=1e-14)


def test_nft_loss_gradient_by_finite_differences():
    c = _tensors(3, n=2)
    r = nft.optimality(c["adv"][:2], 5.0)
    v = c["v"].clone().requires_grad_(True)
    nft.nft_loss(v, c["v_old"], c["xt"], c["x0"], c["t"], r, beta=0.3)[0].sum().backward()

    def f(vv):  # the weights are constants of the gradient (detached): hold them at v
        with torch.no_grad():
            te = c["t"].view(-1, 1, 1, 1)
            out = 0.0
            for coef, vel0 in ((r, 0.3 * c["v"] + 0.7 * c["v_old"]), (1 - r, 1.3 * c["v_old"] - 0.3 * c["v"])):
                w = (c["xt"] - te * vel0 - c["x0"]).abs().mean(dim=(1, 2, 3), keepdim=True)
                vel = 0.3 * vv + 0.7 * c["v_old"] if coef is r else 1.3 * c["v_old"] - 0.3 * vv
                out = out + (coef * ((c["xt"] - te * vel - c["x0"]) ** 2 / w).mean(dim=(1, 2, 3))).sum()
            return 5.0 * out / 0.3

    h = 1e-6
    for idx in [(0, 0, 0, 0), (1, 2, 3, 1), (0, 1, 2, 3)]:
        d = torch.zeros_like(c["v"])
        d[idx] = h
        fd = (f(c["v"] + d) - f(c["v"] - d)) / (2 * h)
        assert float(v.grad[idx]) == pytest.approx(float(fd), rel=1e-6, abs=1e-10)


def test_nft_slot_draws_are_deterministic_and_distinct():
    T = 10
    idx = [nft.slot_timestep_index(1234, j, T) for j in range(T)]
    assert sorted(idx) == list(range(T))  # a permutation: K <= T slots get distinct timesteps
    assert idx == [nft.slot_timestep_index(1234, j, T) for j in range(T)]
    assert idx != [nft.slot_timestep_index(1235, j, T) for j in range(T)]
    a, b = nft.slot_noise(7, 0, (2, 3)), nft.slot_noise(7, 1, (2, 3))
    assert torch.equal(a, nft.slot_noise(7, 0, (2, 3))) and not torch.equal(a, b)
    with pytest.raises(ValueError, match="slot"):
        nft.slot_timestep_index(1, 10, 10)


def test_nft_training_count_is_the_references():
    assert nft_train_count(10) == 9 and nft_train_count(40) == 39 and nft_train_count(1) == 1  # int(0.99 T)
    assert nft_train_count(10, 4) == 4
    with pytest.raises(ValueError, match="train.nft_timesteps"):
        nft_train_count(10, 11)
    plan = nft_plan(10, 3)
    assert plan.sde_steps == () and plan.trained == (0, 1, 2)
