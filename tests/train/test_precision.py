"""Activation recomputation, bf16 mixed precision and fp16 loss scaling against fp32 references.

Tolerances (measured on this CPU, tiny DiT, one chunk of 8 cells): bf16 autocast gradients are within 3 %
relative L2 error of fp32 (measured ~0.5-1 %); fp16 with loss scaling within 1 % (measured 0.1 %) on a loss scaled by 2^-18, where fp16 without scaling
flushes 99.7 % of the gradient entries to zero (relative error 0.94).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from digenrl.config import load_config
from digenrl.models.tiny_dit import TinyDiTConfig, TinyDiTPolicy
from digenrl.train.chunk_loss import LossSettings, train_cells
from digenrl.train.precision import Precision, prepare_policy
from digenrl.train.transaction import GradientTransaction

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from test_chunked_training import _step_batch  # noqa: E402


def _policy(seed=0):
    torch.manual_seed(seed)
    pol = TinyDiTPolicy(TinyDiTConfig(dim=32, depth=2, heads=2))
    with torch.no_grad():  # leave adaLN-Zero's zero init so that every parameter gets a gradient
        for p in pol.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return pol


def _grads(policy, batch, loss_scale=1.0):
    policy.zero_grad(set_to_none=True)
    group = batch.select(list(range(4)))
    cells = [(g, t) for g in range(4) for t in range(batch.latents.shape[1])]
    train_cells(policy, group, cells, settings=LossSettings(noise_level=0.9), loss_scale=loss_scale)
    return torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel()) for p in policy.parameters()])


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def _cfg(*over):
    return load_config(None, list(over))


def test_recomputation_gives_the_same_gradients():
    pol = _policy()
    batch = _step_batch(pol)
    ref = _grads(pol, batch)
    prepare_policy(pol, _cfg("train.activation_checkpointing=true"))
    calls = []
    pol.net.blocks[0].register_forward_pre_hook(lambda *a: calls.append(1))
    out = _grads(pol, batch)
    assert len(calls) == 2  # the block ran again in backward: it was recomputed
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-7)


def test_diffusers_recomputation_gives_the_same_gradients(tmp_path):
    from tiny_diffusers import save_flux

    from digenrl.models.diffusers_flux import FluxPolicy
    from digenrl.models.diffusers_files import load_pipeline

    save_flux(tmp_path / "flux")
    cfg = _cfg("model.kind=flux", f"model.path={tmp_path / 'flux'}", "model.options={height: 32, width: 32, max_sequence_length: 8}")
    pipe = load_pipeline(FluxPolicy.pipeline_class(), str(tmp_path / "flux"), "float32", [])
    pol = FluxPolicy(pipe, cfg.model)
    x = torch.randn(3, *pol.latent_shape)
    cond = pol.encode_prompts(["a cat", "a dog", "red"])

    def grads():
        pol.zero_grad(set_to_none=True)
        pol(x, torch.tensor([0.9, 0.5, 0.2]), cond).square().mean().backward()
        return torch.cat([p.grad.flatten() for p in pol.transformer.parameters() if p.grad is not None])

    ref = grads()
    prepare_policy(pol, cfg.model_copy(update={"train": cfg.train.model_copy(update={"activation_checkpointing": True})}))
    assert pol.transformer.gradient_checkpointing
    torch.testing.assert_close(grads(), ref, rtol=0, atol=1e-7)


def test_bf16_mixed_precision_keeps_fp32_masters_and_is_close_to_fp32():
    pol = _policy()
    batch = _step_batch(pol)
    ref = _grads(pol, batch)
    prec = prepare_policy(pol, _cfg("train.mixed_precision=bf16"))
    assert all(p.dtype == torch.float32 for p in pol.parameters())
    out = _grads(pol, batch)
    with prec.autocast():  # the forward really runs in bf16
        probe = pol.net.blocks[0].mlp[0](torch.randn(2, 32))
    assert probe.dtype == torch.bfloat16
    assert _rel(out, ref) < 0.03
    assert not torch.equal(out, ref)


def test_fp16_loss_scaling_prevents_underflow():
    """A loss scaled like 1 / (B * S) of a large step times small advantages: in fp16 most gradient entries
    flush to zero without loss scaling; with dynamic loss scaling they match fp32 after unscaling."""
    tiny = 2.0 ** -18
    pol = _policy()
    batch = _step_batch(pol)
    ref = _grads(pol, batch, loss_scale=tiny)
    ref_zero = float((ref == 0).float().mean())
    assert ref_zero < 0.05

    pol_plain = _policy()
    prepare_policy(pol_plain, _cfg("train.mixed_precision=fp16", "tuning.loss_scale_init=1.0"))
    plain = _grads(pol_plain, batch, loss_scale=tiny)
    assert (plain == 0).float().mean() > 0.9 and _rel(plain, ref) > 0.5  # underflow without scaling

    pol_scaled = _policy()
    prec = prepare_policy(pol_scaled, _cfg("train.mixed_precision=fp16"))
    scaled = _grads(pol_scaled, batch, loss_scale=tiny)
    assert prec.unscale_and_check(list(pol_scaled.parameters()))
    scaled = torch.cat([p.grad.flatten() for p in pol_scaled.parameters()])
    assert (scaled == 0).float().mean() < ref_zero + 0.01
    assert _rel(scaled, ref) < 0.01


def test_fp16_commit_skips_non_finite_step_and_backs_off():
    pol = _policy()
    batch = _step_batch(pol)
    prec = prepare_policy(pol, _cfg("train.mixed_precision=fp16", "tuning.loss_scale_init=1e30"))
    opt = torch.optim.AdamW(pol.parameters(), lr=1e-2)
    tx = GradientTransaction(pol.parameters(), opt, max_grad_norm=1.0, precision=prec)
    before = [p.detach().clone() for p in pol.parameters()]
    tx.begin(0)
    group = batch.select(list(range(4)))
    train_cells(pol, group, [(0, 0), (1, 0)], settings=LossSettings(noise_level=0.9), loss_scale=1.0)
    tx.commit()
    assert prec.skipped == 1 and prec.scale == pytest.approx(0.5e30)
    assert all(torch.equal(a, p) for a, p in zip(before, pol.parameters()))
    assert tx.version == 1 and not tx.open


def test_precision_growth_rule():
    prec = Precision("fp16", scale=8.0, growth_interval=2)
    prec.update(True)
    assert prec.scale == 8.0
    prec.update(True)
    assert prec.scale == 16.0
    prec.update(False)
    assert prec.scale == 8.0 and prec.skipped == 1
