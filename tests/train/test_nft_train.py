"""train.algorithm=nft (DiffusionNFT, ``algo.nft``) in the trainer: config checks, the ODE sampler contract (x_0
only), the cell loss against the reference formula on a tiny model, chunking invariance, the plan and the hash."""

from __future__ import annotations

import math

import pytest
import torch

from digenrl.config import ConfigError, load_config

SMALL = ["train.prompts_per_step=2", "train.generations=4", "sampler.num_steps=6", "log.progress=false",
         "train.ema_decay=null"]
NFT = ["train.algorithm=nft", "train.nft_timesteps=3"]


def _ctx(tiny_policy, *overrides):
    from digenrl.train.context import build_context

    cfg = load_config(None, [*SMALL, *overrides])
    return cfg, build_context(cfg, policy=tiny_policy)


def _group(ctx, cfg, step=0):
    from digenrl.train.step_math import adv_options, assign_advantages, generate

    prompts = ctx.task.train_prompts(step, 1, cfg.seed)
    G = cfg.train.generations
    batch = generate(ctx.policy, prompts * G, list(range(G)), step=step, run_seed=cfg.seed, version=0,
                     settings=ctx.sampler, plan=ctx.plan(step), reward=ctx.reward)
    batch.rewards = torch.tensor([0.1, 0.9, 0.4, 0.7])[:G]
    assign_advantages(batch, adv_options(cfg.train))
    return batch


# ---- config ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides,match", [
    ([*NFT, "train.clip_range=0.1"], "train.clip_range"),
    ([*NFT, "train.clip_range_high=0.1"], "train.clip_range_high"),
    ([*NFT, "train.kl_form=exact"], "train.kl_form"),
    ([*NFT, "train.timestep_fraction=0.9"], "train.timestep_fraction"),
    ([*NFT, "train.timestep_strategy=window"], "train.timestep_strategy"),
    ([*NFT, "sampler.kind=cps"], "sampler.kind"),
    ([*NFT, "sampler.noise_level=1.0"], "sampler.noise_level"),
    ([*NFT, "train.cfg_detach_uncond=true"], "train.cfg_detach_uncond"),
    ([*NFT, "train.adv_per_reward=true"], "train.adv_per_reward"),
    ([*NFT, "sampler.post_solver=dpmpp_2m"], "sampler.post_solver"),
    (["train.algorithm=nft", "train.nft_timesteps=7"], "train.nft_timesteps"),
    (["train.nft_timesteps=3"], "train.nft_timesteps"),
    (["sampler.nft_solver=euler"], "sampler.nft_solver"),
    (["train.nft_old_policy=current"], "train.nft_old_policy"),
    (["train.nft_beta=0.1"], "train.nft_beta"),
    ([*NFT, "train.nft_old_decay=[0, 0.001, 1.0]"], "train.nft_old_decay"),
    ([*NFT, "train.nft_old_decay=[-1, 0.001, 0.5]"], "train.nft_old_decay"),
    ([*NFT, "train.nft_old_policy=current", "train.nft_old_decay=[0, 0.01, 0.5]"], "train.nft_old_decay"),
])
def test_bad_nft_configs_are_refused_naming_the_key(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, [*SMALL, *overrides])


def test_nft_configs_that_work():
    for extra in ([], ["train.std_mode=global", "runtime.mode=gap_tsp"], ["train.clip_range=0.2"],  # the default value
                  ["train.adv_baseline=batch", "runtime.mode=full"],
                  ["train.minibatches_per_step=2", "train.inner_epochs=2", "runtime.mode=gap_tsp_tag"],
                  ["runtime.mode=full"]):
        cfg = load_config(None, [*SMALL, *NFT, *extra])
    # a run's own dumped config.yaml (every key written out) loads again
    from digenrl.config import Config

    Config.model_validate(cfg.model_dump(mode="json"))


def test_nft_plan_trains_k_slots_and_changes_the_hash():
    from digenrl.control.run_plan import plan_run, timestep_plan
    from digenrl.train.resume_config import check_resume_config, config_hash

    cfg = load_config(None, [*SMALL, *NFT, "runtime.mode=gap_tsp"])
    assert timestep_plan(cfg, 0).sde_steps == () and timestep_plan(cfg, 5).trained == (0, 1, 2)
    assert plan_run(cfg).trained_timesteps == 3 and plan_run(cfg).plan.trained_timesteps == 3
    default = load_config(None, [*SMALL, "train.algorithm=nft"])
    assert plan_run(default).trained_timesteps == 5  # int(0.99 x 6)
    with pytest.raises(ConfigError, match="train.nft_timesteps"):
        check_resume_config(cfg.model_dump(mode="json"), load_config(None, [*SMALL, "train.algorithm=nft",
                                                                           "train.nft_timesteps=2"]))
    assert config_hash(cfg) != config_hash(load_config(None, SMALL))


# ---- the sampler: the Euler ODE, x_0 kept, no transition recorded -----------------------------------------
def test_nft_sampler_records_the_clean_sample_only(tiny_policy):
    from digenrl.models.base import guided_velocity
    from digenrl.rollout.noise import trajectory_noise

    cfg, ctx = _ctx(tiny_policy, *NFT, "sampler.nft_solver=euler")
    _move(ctx.policy)
    batch = _group(ctx, cfg)
    assert batch.latents.shape[:2] == (4, 0) and batch.next_latents.shape[:2] == (4, 0)
    assert batch.log_probs.shape == (4, 0) and batch.means is None
    assert batch.trained_steps.tolist() == [0, 1, 2]  # the training slots
    assert batch.select([2, 0]).final.shape == batch.final[[2, 0]].shape
    ctx.policy.eval()
    with torch.no_grad():  # x_0 is the deterministic Euler ODE from x_T (the SDE noise plays no part)
        x = torch.stack([trajectory_noise(int(s), tuple(ctx.policy.latent_shape), 6)[0] for s in batch.seed])
        cond = ctx.policy.encode_prompts(batch.prompts)
        for i in range(6):
            v = guided_velocity(ctx.policy, x, batch.sigmas[i].expand(4), cond, 1.0)
            x = x + v * (batch.sigmas[i + 1] - batch.sigmas[i])
    torch.testing.assert_close(batch.final, x, rtol=1e-5, atol=1e-5)


def _move(policy):
    """Random weights everywhere (the tiny DiT's zero-initialised output layers give v = 0, which every solver
    integrates alike)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))


def test_nft_default_sampler_is_the_references_dpm2(tiny_policy):
    """sampler.nft_solver=dpmpp_2m (the default): DiffusionNFT's sample.solver = "dpm2" (deterministic), the
    updates of its flow_grpo/diffusers_patch/solver.py written out here with alpha = 1 - sigma, lambda =
    log(alpha / sigma): step 0 and the last step ``ddim_update`` with eta 0, the others
    ``multistep_dpm_solver_second_order_update`` on the data predictions x0 = x - sigma v."""
    from digenrl.models.base import guided_velocity
    from digenrl.rollout.noise import trajectory_noise

    cfg, ctx = _ctx(tiny_policy, *NFT)
    assert cfg.sampler.nft_solver == "dpmpp_2m"
    _move(ctx.policy)
    batch = _group(ctx, cfg)
    ctx.policy.eval()
    sig = batch.sigmas.double()
    lam = lambda v: torch.log(1 - v) - torch.log(v)  # noqa: E731
    with torch.no_grad():
        x = torch.stack([trajectory_noise(int(s), tuple(ctx.policy.latent_shape), 6)[0] for s in batch.seed])
        euler = x.clone()
        cond = ctx.policy.encode_prompts(batch.prompts)
        prev = None
        for i in range(6):
            s, t = sig[i], sig[i + 1]
            v = guided_velocity(ctx.policy, x, batch.sigmas[i].expand(4), cond, 1.0)
            x0 = x - batch.sigmas[i] * v
            if i in (0, 5):  # ddim_update(eta=0): (1 - t) x0 + t (x - (1 - s) x0) / s
                x = ((1 - t) * x0 + t * (x - (1 - s) * x0) / s).float()
            else:
                h, h0 = lam(t) - lam(s), lam(s) - lam(sig[i - 1])
                d0, d1 = x0, (x0 - prev) / (h0 / h)
                x = ((t / s) * x - (1 - t) * (torch.exp(-h) - 1) * d0 - 0.5 * (1 - t) * (torch.exp(-h) - 1) * d1).float()
            prev = x0
            ve = guided_velocity(ctx.policy, euler, batch.sigmas[i].expand(4), cond, 1.0)
            euler = euler + ve * (batch.sigmas[i + 1] - batch.sigmas[i])
    torch.testing.assert_close(batch.final, x, rtol=1e-5, atol=1e-5)
    assert float((batch.final - euler).abs().max()) > 1e-3  # the test can fail: the Euler ODE ends elsewhere


# ---- the cell loss ---------------------------------------------------------------------------------------
def _reference_grad(policy, group, cells, scale, beta_kl=0.0, ref=None, old_model=None, beta=1.0):
    """The reference's loss per cell (scripts/train_nft_sd3.py; c = 5; old = ``old_model``'s prediction, or the
    current weights' when None), the draws written out from the trajectory seed as algo.nft documents them."""
    from digenrl.algo.timesteps import stable_seed

    policy.zero_grad()
    total = 0.0
    for g, j in cells:
        seed = int(group.seed[g])
        perm = torch.randperm(6, generator=torch.Generator().manual_seed(stable_seed(seed, "nft_t")))
        t = group.sigmas[int(perm[j])]
        x0 = group.final[g:g + 1]
        eps = torch.randn(x0.shape[1:], generator=torch.Generator().manual_seed(stable_seed(seed, "nft_eps", j)))
        xt = (1 - t) * x0 + t * eps[None]
        cond = policy.encode_prompts([group.prompts[g]])
        v = policy(xt, t.reshape(1), cond)
        with torch.no_grad():
            old = v.detach() if old_model is None else old_model(xt, t.reshape(1), cond)
        a = float(group.advantages[g])
        r = min(max(a / 5.0 / 2.0 + 0.5, 0.0), 1.0)
        x0p = xt - t * (beta * v + (1 - beta) * old)
        x0n = xt - t * ((1 + beta) * old - beta * v)
        wp = (x0p - x0).abs().mean().detach().clamp_min(1e-5)
        wn = (x0n - x0).abs().mean().detach().clamp_min(1e-5)
        loss = 5.0 * (r * ((x0p - x0) ** 2 / wp).mean() + (1 - r) * ((x0n - x0) ** 2 / wn).mean()) / beta
        if beta_kl:
            with torch.no_grad():
                v_ref = ref(xt, t.reshape(1), cond)
            loss = loss + beta_kl * ((v - v_ref) ** 2).mean()
        total = total + loss
    (total * scale).backward()
    return [p.grad.clone() for p in policy.parameters()], float(total.detach())


@pytest.mark.parametrize("beta_kl,old,beta", [(0.0, "current", 1.0), (0.5, "current", 1.0), (0.5, "soft", 1.0),
                                              (0.0, "soft", 0.1)])
def test_nft_cells_give_the_reference_gradient(tiny_policy, beta_kl, old, beta):
    """``soft``: the old copy is the weights at build time (before the move below), the reference's ``old``
    adapter: its prediction comes from a separate copy of the policy holding them (not from the swap)."""
    import copy

    from digenrl.train.chunk_loss import train_cells

    cfg, ctx = _ctx(tiny_policy, *NFT, f"train.beta_kl={beta_kl}", "train.filter_zero_advantage=false",
                    f"train.nft_old_policy={old}", f"train.nft_beta={beta}")
    group = _group(ctx, cfg)
    old_model = copy.deepcopy(ctx.policy).requires_grad_(False) if old == "soft" else None
    if beta_kl or old == "soft":  # move the weights off the reference (and the old copy) so those terms act
        with torch.no_grad():
            for p in ctx.policy.parameters():
                p.add_(1e-2 * torch.randn_like(p))
    before = [p.detach().clone() for p in ctx.policy.parameters()]
    cells = [(g, j) for g in range(4) for j in range(3)]
    ctx.policy.zero_grad()
    stats = train_cells(ctx.policy, group, cells, settings=ctx.loss, loss_scale=0.125, ref_policy=ctx.ref_policy)
    got = [p.grad.clone() for p in ctx.policy.parameters()]
    assert all(torch.equal(a, p) for a, p in zip(before, ctx.policy.parameters()))  # the swap left theta as it was
    want, loss = _reference_grad(ctx.policy, group, cells, 0.125, beta_kl, ctx.ref_policy, old_model, beta)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-8)
    assert stats.trained == 12 and stats.loss == pytest.approx(loss, rel=1e-5)
    assert (stats.kl > 0) == (beta_kl > 0) and (stats.approx_kl > 0) == (old == "soft")
    assert any(float(a.abs().max()) > 0 for a in got)
    if old == "soft":  # the test can fail: with old = current the gradient is another one
        cur, _ = _reference_grad(ctx.policy, group, cells, 0.125, beta_kl, ctx.ref_policy, None, beta)
        assert max(float((a - b).abs().max()) for a, b in zip(cur, want)) > 1e-3 * max(float(b.abs().max()) for b in want)


def test_nft_chunking_does_not_change_the_gradient(tiny_policy):
    from digenrl.train.chunk_loss import train_cells
    from train_helpers import train_group

    cfg, ctx = _ctx(tiny_policy, *NFT)
    group = _group(ctx, cfg)
    cells = [(g, j) for j in range(3) for g in range(4)]
    ctx.policy.zero_grad()
    train_cells(ctx.policy, group, cells, settings=ctx.loss, loss_scale=1.0)
    whole = [p.grad.clone() for p in ctx.policy.parameters()]
    for cg, ct in ((1, 1), (3, 2), (4, 3), (2, 1)):
        ctx.policy.zero_grad()
        stats = train_group(ctx.policy, group, settings=ctx.loss, loss_scale=1.0, chunk_generations=cg,
                            chunk_timesteps=ct)
        assert stats.cells == 12
        for a, b in zip(whole, (p.grad for p in ctx.policy.parameters())):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("old", ["current", "soft"])
def test_nft_run_trains_k_cells_per_sample(tiny_policy, old):
    from product import product_steps

    cfg = load_config(None, [*SMALL, *NFT, "train.filter_zero_advantage=false", f"train.nft_old_policy={old}"])
    _, rows = product_steps(cfg, policy=tiny_policy, steps=2)
    for k, row in enumerate(rows):
        assert row["cells"] == 2 * 4 * 3 and row["grad_norm"] > 0 and math.isfinite(row["loss"])
        assert row["clipfrac"] == 0.0  # old_deviate: 0 while old = theta (current; soft before its first move)
        assert (row["approx_kl"] > 0) == (old == "soft" and k > 0), row["approx_kl"]


# ---- step-wide statistics in a pipelined trainer: the deferred heads train NFT's A l + m exactly ----------
@pytest.mark.parametrize("std_mode,baseline", [("global", "group"), ("group", "batch"), ("global", "batch")])
def test_nft_deferred_round_equals_training_with_the_final_advantages(tiny_policy, std_mode, baseline):
    import copy

    from digenrl.algo.timesteps import nft_plan
    from digenrl.rollout.sampler import SamplerSettings
    from digenrl.schedule.layout import tile_grid
    from digenrl.tasks.digits import DigitsTask
    from digenrl.train.chunk_loss import LossSettings
    from digenrl.train.loss_scale import DeferredRound, loss_scale, step_advantages
    from digenrl.train.step_math import adv_options, generate

    from train_helpers import split_groups, train_group

    G, K = 4, 2
    prompts = DigitsTask().train_prompts(0, 3, seed=0)
    batch = generate(tiny_policy, [p for p in prompts for _ in range(G)], [g for _ in prompts for g in range(G)],
                     step=0, run_seed=1, version=0, settings=SamplerSettings(num_steps=4, record_cells=False),
                     plan=nft_plan(4, K))
    groups, ref = split_groups(batch), copy.deepcopy(tiny_policy)
    with torch.no_grad():  # the reference differs from the policy: the KL term acts
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    # group 0 ties (zero advantage with the group baseline); the step's mean is 0.5 (ties it with the batch one)
    rewards = {0: (0.5, 0.5, 0.5, 0.5), 1: (0.0, 0.25, 0.5, 0.25), 2: (0.75, 1.0, 0.5, 0.75)}
    cfg = load_config(None, [f"train.std_mode={std_mode}", f"train.adv_baseline={baseline}", "train.adv_clip_max=0.8",
                             "train.algorithm=nft", f"train.nft_timesteps={K}"]).train
    settings = LossSettings(algorithm="nft", beta_kl=0.05, filter_zero_advantage=True, adv_clip_max=0.8)
    final = step_advantages(rewards, cfg)
    assert any(bool((final[k] != step_advantages(rewards, cfg, clip=float("inf"))[k]).any()) for k in final)
    scale = loss_scale(K, final.values(), True)
    params = [p for p in tiny_policy.parameters() if p.requires_grad]

    for k, g in enumerate(groups):
        g.advantages = final[k][g.gen_index]
    tiny_policy.zero_grad(set_to_none=True)
    want_stats = None
    for g in groups:
        st = train_group(tiny_policy, g, settings=settings, loss_scale=scale.cell(), chunk_generations=2,
                         chunk_timesteps=1, ref_policy=ref)
        want_stats = st if want_stats is None else want_stats.add(st)
    want = [p.grad.clone() for p in params]

    tiny_policy.zero_grad(set_to_none=True)
    dr = DeferredRound(adv_options(cfg), settings, params, {1: rewards[1]})
    for k in (1, 2, 0):
        for chunk in tile_grid(list(range(G)), K, 3, 1):
            dr.train(tiny_policy, groups[k], k, rewards[k], chunk, loss_scale=1 / K, ref_policy=ref)
    stats = dr.finish(tiny_policy, dict(enumerate(groups)), rewards, cfg, loss_scale=1 / K, ref_policy=ref, piece=3)
    got = [p.grad.clone() for p in params]
    err = max(float((a - b).norm() / b.norm().clamp_min(1e-12)) for a, b in zip(got, want))
    assert err < 2e-5, f"deferred gradient differs by {err:.2e}"
    assert not dr.outside and stats.trained == want_stats.trained
    for key in ("loss", "kl"):
        assert getattr(stats, key) == pytest.approx(getattr(want_stats, key), rel=1e-4, abs=1e-6), key
