"""Recipe parity: one training step of a Flow-GRPO-style and of a DanceGRPO-style reference, written here from
their scripts' formulas, ends with the same parameters as ``digenrl`` with the equivalent config.

Flow-GRPO (``scripts/train_sd3.py``, ``sd3_sde_with_logprob.py``, ``stat_tracking.py``, ``ema.py``):
  advantages (r - group mean) / (numpy std + 1e-4), clamped to +-adv_clip_max; samples with advantage 0 are
  dropped; S = int(T * timestep_fraction) first steps; two optimizer steps per sampled batch (here: groups 0-1,
  then groups 2-3); per timestep loss = mean over the train batch of max(-A r, -A clip(r)) + beta * KL with
  KL = mean((mu - mu_ref)^2) / (2 std_dev_t^2), divided by S (accelerate's accumulation); clip_grad_norm_,
  AdamW step; then EMA with d_n = min((1 + n) / (10 + n), decay).
DanceGRPO (``fastvideo/train_grpo_flux.py``): the eta-SDE in its score form, (r - mean) / (torch std + 1e-8),
  all T - 1 steps but the last, per sample loss / (GA * train_timesteps), one optimizer step for the group.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch

from digenrl.config import load_config
from digenrl.rewards.base import WeightedSum
from digenrl.tasks.digits import DigitsTask
from digenrl.train.step_math import generate

from product import product_steps, product_worker


def _reward(images, prompts):
    """A deterministic reward; the first prompt's group gets a constant (zero std: its advantages are 0)."""
    first = prompts[0].uid if not hasattr(_reward, "uid0") else _reward.uid0
    r = images.flatten(1).mean(1).double() * 7.0 % 1.0
    return torch.tensor([0.5 if p.uid == first else float(v) for p, v in zip(prompts, r)])


def _setup(tiny_policy, overrides):
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # move off the adaLN-zero init so that every tensor gets a gradient
        for p in tiny_policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    cfg = load_config(None, ["train.prompts_per_step=4", "train.generations=4", "sampler.num_steps=6",
                             "train.chunk_generations=3", "train.chunk_timesteps=2", "log.progress=false", *overrides])
    task = DigitsTask()
    prompts = task.train_prompts(0, 4, cfg.seed)
    _reward.uid0 = prompts[0].uid
    reward = WeightedSum({"fake": (1.0, _reward)})
    ref_model = copy.deepcopy(tiny_policy)
    worker = product_worker(cfg, policy=tiny_policy, reward=reward, task=task)  # digenrl train's colocated worker
    rep = [p for p in prompts for _ in range(4)]
    gens = [g for _ in prompts for g in range(4)]
    batch = generate(copy.deepcopy(ref_model), rep, gens, step=0, run_seed=cfg.seed, version=0, settings=worker.ctx.sampler,
                     plan=worker.ctx.plan(0), reward=reward)
    return cfg, worker, ref_model, batch


def _step(cfg, worker) -> dict:
    """Step 0 of the product (``digenrl train``'s one path, in this process) on ``worker``; its row."""
    return product_steps(cfg, worker=worker, steps=1)[1][0]


def _flow_grpo_mean(x, v, sigma, sigma_next, a):
    """Flow-GRPO's prev_sample_mean and std_dev_t (sigma == 1 uses sigmas[1] in the 1 - sigma factor)."""
    s_t = torch.sqrt(sigma / (1 - torch.where(sigma == 1, sigma_next, sigma))) * a
    dt = sigma_next - sigma
    mean = x * (1 + s_t**2 / (2 * sigma) * dt) + v * (1 + s_t**2 * (1 - sigma) / (2 * sigma)) * dt
    return mean, s_t, s_t * torch.sqrt(-dt)


def _rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def test_flow_grpo_style_step_parity(tiny_policy):
    cfg, worker, model, batch = _setup(tiny_policy, [
        "sampler.noise_level=0.7", "train.timestep_fraction=0.99", "train.minibatches_per_step=2",
        "train.beta_kl=0.01", "train.clip_range=1e-4", "train.lr=3e-4", "train.weight_decay=1e-4",
        "train.max_grad_norm=1.0", "train.adam_epsilon=1e-6", "train.ema_decay=0.9", "train.ema_every=1", "train.adv_clip_max=5"])
    frozen = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.999), weight_decay=1e-4, eps=1e-6)
    ema = {n: p.detach().clone() for n, p in model.named_parameters()}
    S = int(6 * 0.99)
    assert batch.latents.shape[1] == S == 5
    # stat_tracking.py: per prompt (r - mean) / (np.std + 1e-4); then clamp in the loss
    r = batch.rewards.double().numpy()
    uids = np.array([p.uid for p in batch.prompts])
    adv = np.zeros_like(r)
    for u in np.unique(uids):
        m = uids == u
        adv[m] = (r[m] - r[m].mean()) / (r[m].std() + 1e-4)
    adv = torch.as_tensor(adv)
    order = list(dict.fromkeys(uids.tolist()))
    n_opt = 0
    for mb in (order[:2], order[2:]):  # two optimizer steps per sampled batch, two groups each
        idx = [i for i in range(len(batch)) if uids[i] in mb and adv[i] != 0]  # zero-advantage filter
        x_all, cond = batch.latents[idx], model.encode_prompts([batch.prompts[i] for i in idx])
        for j in range(S):
            i_step = int(batch.trained_steps[j])
            sig, sig_n = batch.sigmas[i_step].expand(len(idx)), batch.sigmas[i_step + 1].expand(len(idx))
            x, x_next = x_all[:, j], batch.next_latents[idx, j]
            v = model(x, sig, cond)
            mean, s_t, std = _flow_grpo_mean(x, v, sig.view(-1, 1, 1, 1), sig_n.view(-1, 1, 1, 1), 0.7)
            logp = (-((x_next - mean) ** 2) / (2 * std**2) - torch.log(std) - math.log(math.sqrt(2 * math.pi))).mean(dim=(1, 2, 3))
            with torch.no_grad():
                mean_ref, _, _ = _flow_grpo_mean(x, frozen(x, sig, cond), sig.view(-1, 1, 1, 1), sig_n.view(-1, 1, 1, 1), 0.7)
            a = adv[idx].clamp(-5, 5).float()
            ratio = torch.exp(logp - batch.log_probs[idx, j])
            policy_loss = torch.mean(torch.maximum(-a * ratio, -a * ratio.clamp(1 - 1e-4, 1 + 1e-4)))
            kl = torch.mean(((mean - mean_ref) ** 2).mean(dim=(1, 2, 3), keepdim=True) / (2 * s_t**2))
            ((policy_loss + 0.01 * kl) / S).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        n_opt += 1
        d = min((1 + n_opt) / (10 + n_opt), 0.9)
        for n, p in model.named_parameters():
            ema[n] += (1 - d) * (p.detach() - ema[n])

    row = _step(cfg, worker)
    ctx = worker.ctx
    assert row["kept_fraction"] == 0.75  # one of four groups has a constant reward
    got = dict(ctx.policy.named_parameters())
    for n, p in model.named_parameters():
        assert _rel(got[n].detach(), p.detach()) < 1e-6, n
        assert _rel(ctx.ema.shadow[n], ema[n]) < 1e-6, n
    assert ctx.transaction.version == 1  # two commits, one publish


def test_dance_grpo_style_step_parity(tiny_policy):
    eta = 0.3
    cfg, worker, model, batch = _setup(tiny_policy, [
        "sampler.kind=dance", f"sampler.noise_level={eta}", "train.timestep_fraction=0.84",
        "train.adv_std_unbiased=true", "train.adv_eps=1e-8", "train.filter_zero_advantage=false",
        "train.clip_range=1e-4", "train.lr=1e-5", "train.weight_decay=1e-4", "train.max_grad_norm=1.0"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.999), weight_decay=1e-4, eps=1e-8)
    T = 6
    S = T - 1  # DanceGRPO: every step but the last (timestep_fraction 1 of the T - 1 kept steps)
    assert batch.latents.shape[1] == S
    uids = [p.uid for p in batch.prompts]
    adv = torch.zeros(len(batch))
    for u in dict.fromkeys(uids):
        m = torch.tensor([x == u for x in uids])
        g = batch.rewards[m].float()
        adv[m] = (g - g.mean()) / (g.std() + 1e-8)  # torch std: unbiased
    GA = len(batch)  # one optimizer step over the sampled batch
    for i in range(len(batch)):
        cond = model.encode_prompts([batch.prompts[i]])
        for j in torch.randperm(S).tolist():  # DanceGRPO visits the steps in a random order
            sig, sig_n = batch.sigmas[j], batch.sigmas[j + 1]
            x, x_next = batch.latents[i : i + 1, j], batch.next_latents[i : i + 1, j]
            v = model(x, sig.expand(1), cond)
            # flux_step: Euler mean + score correction, std = eta sqrt(sigma - sigma')
            dsigma = sig_n - sig
            x0 = x - sig * v
            score = -(x - x0 * (1 - sig)) / sig**2
            mean = x + dsigma * v + (-0.5 * eta**2 * score) * dsigma
            std = eta * math.sqrt(float(sig - sig_n))
            logp = (-((x_next - mean) ** 2) / (2 * std**2) - math.log(std) - math.log(math.sqrt(2 * math.pi))).mean()
            a = adv[i].clamp(-5, 5)
            ratio = torch.exp(logp - batch.log_probs[i, j])
            loss = torch.mean(torch.maximum(-a * ratio, -a * ratio.clamp(1 - 1e-4, 1 + 1e-4))) / (GA * S)
            loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()

    _step(cfg, worker)
    ctx = worker.ctx
    got = dict(ctx.policy.named_parameters())
    for n, p in model.named_parameters():
        assert _rel(got[n].detach(), p.detach()) < 1e-6, n
