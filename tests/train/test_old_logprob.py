"""``train.old_logprob``, ``train.tis_cap`` and the mismatch metrics (``train.old_logprob``, ``train.chunk_loss``)
against their formulas, written here from the docstring's definitions: the transition's log-density is Flow-GRPO's
Gaussian (``oracle_logp``, not ``algo.sde``), the loss the clipped ratio times the truncated weight."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from digenrl.algo.timesteps import select_timesteps
from digenrl.config import load_config
from digenrl.rollout.sampler import SamplerSettings
from digenrl.tasks.digits import DigitsTask
from digenrl.train.chunk_loss import CellStats, LossSettings, train_cells
from digenrl.train.step_work import generate

from train_helpers import split_groups

NOISE, T, FRACTION = 0.8, 4, 0.5


def _batch(policy, prompts=3, G=4):
    ps = DigitsTask().train_prompts(0, prompts, seed=0)
    batch = generate(policy, [p for p in ps for _ in range(G)], [g for _ in ps for g in range(G)], step=0, run_seed=1,
                     version=0, settings=SamplerSettings(num_steps=T, noise_level=NOISE),
                     plan=select_timesteps(T, fraction=FRACTION))
    batch.advantages = torch.randn(len(batch), generator=torch.Generator().manual_seed(2))
    return batch


def oracle_logp(policy, batch, rows, tpos):
    """Flow-GRPO's log p(x' | x), averaged over the latent: s_t = a sqrt(sigma / (1 - sigma)) (sigma' in 1 - sigma
    at sigma = 1), mean = x (1 + s_t^2 dt / (2 sigma)) + v (1 + s_t^2 (1 - sigma) / (2 sigma)) dt, std = s_t sqrt(-dt)."""
    x, xn = batch.latents[rows, tpos], batch.next_latents[rows, tpos]
    idx = batch.trained_steps[tpos]
    shape = (-1,) + (1,) * (x.ndim - 1)
    s, sn = batch.sigmas[idx].view(shape), batch.sigmas[idx + 1].view(shape)
    v = policy(x, batch.sigmas[idx], policy.encode_prompts([batch.prompts[r] for r in rows.tolist()]))
    dt = sn - s
    st = NOISE * torch.sqrt(s / (1 - torch.where(s >= 1, sn, s)))
    mean = x * (1 + st ** 2 / (2 * s) * dt) + v * (1 + st ** 2 * (1 - s) / (2 * s)) * dt
    std = st * torch.sqrt(-dt)
    return (-((xn - mean) ** 2) / (2 * std ** 2) - torch.log(std) - 0.5 * math.log(2 * math.pi)).flatten(1).mean(1)


def _cells(group):
    return [(g, t) for g in group.gen_index.tolist() for t in range(len(group.trained_steps))]


def _rows(group, cells):
    row_of = {g: r for r, g in enumerate(group.gen_index.tolist())}
    return torch.tensor([row_of[g] for g, _ in cells]), torch.tensor([t for _, t in cells])


def _grads(policy):
    return [p.grad.detach().clone() for p in policy.parameters()]


def test_mismatch_metrics_are_the_formulas(tiny_policy):
    """0.5 mean d^2, max |d| and the share of exp(-d) outside [1 - eps, 1 + eps], d = logp_gen - logp_trainer, over
    the on-policy cells of the first round; a stale sample (version k - 1) and a later round count nothing."""
    batch = _batch(tiny_policy)
    batch.log_probs = batch.log_probs + 0.01 * torch.randn(batch.log_probs.shape, generator=torch.Generator().manual_seed(3))
    batch.version[:2] = -1  # two stale samples of step 0
    settings = LossSettings(noise_level=NOISE, clip_range=0.005)
    stats, ds = CellStats(), []
    for group in split_groups(batch):
        cells = _cells(group)
        stats = stats.add(train_cells(tiny_policy, group, cells, settings=settings, loss_scale=1.0))
        rows, tpos = _rows(group, cells)
        with torch.no_grad():
            d = group.log_probs[rows, tpos] - oracle_logp(tiny_policy, group, rows, tpos)
        ds.append(d[group.version[rows] == 0])
    d = torch.cat(ds).double()
    m = stats.means()
    assert m["mismatch/cells"] == len(d) == len(batch.log_probs.flatten()) - 2 * len(batch.trained_steps)
    assert m["mismatch/approx_kl"] == pytest.approx(float(0.5 * (d ** 2).mean()), rel=1e-4)
    assert m["mismatch/max_abs_logp"] == pytest.approx(float(d.abs().max()), rel=1e-4)
    r0 = torch.exp(-d)
    want = float(((r0 < 1 - 0.005) | (r0 > 1 + 0.005)).double().mean())
    assert 0 < want < 1 and m["mismatch/clipfrac"] == pytest.approx(want)
    later = train_cells(tiny_policy, split_groups(batch)[1], _cells(split_groups(batch)[1]), settings=settings,
                        loss_scale=1.0, step_start=False)
    assert later.mismatch_cells == 0 and later.means()["mismatch/approx_kl"] == 0.0


@pytest.mark.parametrize("step_start", [True, False])
@pytest.mark.parametrize("tis_cap", [None, 1.05])
def test_recompute_and_tis_gradient_is_the_formula(tiny_policy, step_start, tis_cap):
    """L = w max(-A r, -A clip(r)), r = exp(logp - logp_start), w = min(exp(logp_start - logp_gen), C) (or 1):
    logp_start from the training forward in the first round, from the step-start weights in a later one."""
    from digenrl.train.old_logprob import attach

    batch = _batch(tiny_policy)
    g = torch.Generator().manual_seed(4)
    batch.log_probs = batch.log_probs + 0.1 * torch.randn(batch.log_probs.shape, generator=g)  # a biased generator
    cfg = load_config(None, ["train.old_logprob=recompute", "train.minibatches_per_step=2"]).train
    attach(tiny_policy, cfg, version=0)  # the step-start snapshot (theta_0)
    start = copy.deepcopy(tiny_policy)
    if not step_start:  # a later round: the weights moved since the step started
        with torch.no_grad():
            for p in tiny_policy.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    live = copy.deepcopy(tiny_policy)
    eps = 0.05
    settings = LossSettings(noise_level=NOISE, clip_range=eps, old_logprob="recompute", tis_cap=tis_cap)
    group = split_groups(batch)[0]
    cells = _cells(group)
    tiny_policy.zero_grad(set_to_none=True)
    train_cells(tiny_policy, group, cells, settings=settings, loss_scale=1.0, step_start=step_start)
    got = _grads(tiny_policy)

    rows, tpos = _rows(group, cells)
    logp = oracle_logp(live, group, rows, tpos)
    with torch.no_grad():
        logp_start = logp.detach() if step_start else oracle_logp(start, group, rows, tpos)
    w = torch.ones_like(logp) if tis_cap is None else torch.exp(logp_start - group.log_probs[rows, tpos]).clamp(max=tis_cap)
    if tis_cap is not None:
        assert bool((w == tis_cap).any()) and bool((w < tis_cap).any())  # the cap acts on some cells only
    A = group.advantages[rows]
    r = torch.exp(logp - logp_start)
    (w * torch.maximum(-A * r, -A * r.clamp(1 - eps, 1 + eps))).sum().backward()
    want = _grads(live)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    for a, b in zip(tiny_policy.parameters(), live.parameters()):  # the snapshot was swapped back out
        assert torch.equal(a, b)


def _train_step(policy, overrides, offset):
    """The weights after one step of the product (``digenrl train``'s path, in this process) whose recorded log-probs
    carry ``offset`` (a generator biased like verl-omni PR 279's)."""
    from product import product_steps, product_worker

    cfg = load_config(None, ["train.prompts_per_step=4", "train.generations=4", "sampler.num_steps=4",
                             "train.timestep_fraction=0.5", "train.clip_range=0.2", "log.progress=false",
                             "train.ema_decay=null", *overrides])
    worker = product_worker(cfg, policy=copy.deepcopy(policy))
    sample = worker.generate_parts

    def biased(policy, parts, version, *lead):  # a constant bias, or (offset < 0) a random one of that scale per cell
        *batches, infos = sample(policy, parts, version, *lead)
        gen = torch.Generator().manual_seed(9)
        for b in batches:
            if b is not None:
                b.log_probs = b.log_probs + (offset if offset >= 0 else
                                             -offset * torch.randn(b.log_probs.shape, generator=gen))
        return (*batches, infos)

    worker.generate_parts = biased
    product_steps(cfg, worker=worker, steps=1)
    return torch.cat([p.detach().flatten() for p in worker.ctx.policy.parameters()])


def _d(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("rounds", [[], ["train.minibatches_per_step=2", "train.inner_epochs=2"]],
                         ids=["one_round", "four_rounds"])
def test_recompute_ignores_a_biased_generator_and_generator_mode_does_not(tiny_policy, rounds):
    """A +0.5 log-prob bias puts every first-round ratio at exp(-0.5), outside the 0.2 clip band: with the generator's
    log-probs the step trains something else; recomputed, exactly what an unbiased generator gives."""
    before = torch.cat([p.detach().flatten() for p in tiny_policy.parameters()])
    gen0, gen_b = (_train_step(tiny_policy, rounds, o) for o in (0.0, 0.5))
    rec0, rec_b = (_train_step(tiny_policy, ["train.old_logprob=recompute", *rounds], o) for o in (0.0, 0.5))
    moved = _d(gen0, before)
    assert moved > 1e-6
    assert _d(gen_b, gen0) > 0.1 * _d(gen0, before)  # the bias changes generator-mode training
    assert _d(rec_b, rec0) < 1e-6 * max(1.0, moved)  # ... not recompute's
    assert _d(rec0, gen0) < 1e-3 * moved  # unbiased, both give the same step (up to float noise)
    rec_r = _train_step(tiny_policy, ["train.old_logprob=recompute", *rounds], -0.3)  # a random bias per cell
    assert _d(rec_r, rec0) < 1e-6 * max(1.0, moved)
    if rounds:  # TIS sees it: min(exp(logp_start - logp_gen), C) weighs each cell's policy term differently
        tis_r = _train_step(tiny_policy, ["train.old_logprob=recompute", "train.tis_cap=2", *rounds], -0.3)
        tis0 = _train_step(tiny_policy, ["train.old_logprob=recompute", "train.tis_cap=2", *rounds], 0.0)
        assert _d(tis0, rec0) < 1e-3 * moved and _d(tis_r, rec0) > 0.1 * moved


def test_a_colocated_run_logs_a_zero_mismatch(tiny_policy):
    """Colocated: the generator is the trainer, so the mismatch is float noise, measured on every first-round
    cell."""
    from product import product_steps

    cfg = load_config(None, ["train.prompts_per_step=2", "train.generations=4", "sampler.num_steps=4",
                             "train.minibatches_per_step=2", "train.old_logprob=recompute", "train.ema_decay=null",
                             "log.progress=false"])
    worker, rows = product_steps(cfg, policy=tiny_policy, steps=2)
    for k, row in enumerate(rows):
        assert {"mismatch/approx_kl", "mismatch/max_abs_logp", "mismatch/clipfrac", "mismatch/cells"} <= set(row)
        assert 0 < row["mismatch/cells"] <= 4 * len(worker.ctx.plan(k).trained)  # the first minibatch's group only
        assert row["mismatch/max_abs_logp"] < 1e-5 and row["mismatch/clipfrac"] == 0.0


def test_step_start_snapshot_refuses_another_step(tiny_policy):
    from digenrl.train.old_logprob import attach, step_start_of, sync_step_start

    cfg = load_config(None, ["train.old_logprob=recompute", "train.inner_epochs=2"]).train
    snap = attach(tiny_policy, cfg, version=3)
    assert step_start_of(tiny_policy) is snap
    snap.check(3)
    with pytest.raises(RuntimeError, match="step 3, not of step 4"):
        snap.check(4)
    sync_step_start(tiny_policy, 4)
    snap.check(4)
    assert attach(tiny_policy, load_config(None, ["train.old_logprob=recompute"]).train) is None  # one round: none
