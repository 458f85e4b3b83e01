"""train.algorithm in the reference loop, the sampler contract, the config checks, the resume hash and the plan."""

from __future__ import annotations

import math

import pytest
import torch

from digenrl.config import ConfigError, load_config

SMALL = ["train.prompts_per_step=2", "train.generations=4", "sampler.num_steps=6", "log.progress=false",
         "train.ema_decay=null"]
MIX = ["train.algorithm=mixgrpo", "train.window_size=2", "train.window_shift_interval=1"]


def _ctx(tiny_policy, *overrides):
    from digenrl.train.context import build_context

    cfg = load_config(None, [*SMALL, *overrides])
    return cfg, build_context(cfg, policy=tiny_policy)


def _batch(ctx, cfg, step=0):
    from digenrl.train.step_math import adv_options, assign_advantages, generate

    prompts = ctx.task.train_prompts(step, cfg.train.prompts_per_step, cfg.seed)
    rep = [p for p in prompts for _ in range(cfg.train.generations)]
    gens = [g for _ in prompts for g in range(cfg.train.generations)]
    batch = generate(ctx.policy, rep, gens, step=step, run_seed=cfg.seed, version=0, settings=ctx.sampler,
                     plan=ctx.plan(step), reward=ctx.reward)
    batch.rewards = torch.rand(len(batch), generator=torch.Generator().manual_seed(step + 1))
    assign_advantages(batch, adv_options(cfg.train))
    return batch


# ---- config ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides,match", [
    (["train.algorithm=grpo_guard", "sampler.kind=cps"], "train.algorithm: grpo_guard"),
    (["train.algorithm=grpo_guard", "train.std_mode=global", "runtime.mode=gap_tsp"], "train.algorithm: grpo_guard"),
    ([*MIX, "train.window_range=[0, 3]"], "train.window_range"),
    ([*MIX, "train.timestep_strategy=window"], "train.timestep_strategy"),
    ([*MIX, "train.window_size=5"], "train.window_size"),
    (["train.algorithm=nft", "train.clip_range=0.1"], "train.clip_range"),
])
def test_bad_algorithm_configs_are_refused_naming_the_key(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, [*SMALL, *overrides])


def test_grpo_guard_with_global_std_runs_where_the_step_waits_for_its_rewards():
    load_config(None, [*SMALL, "train.algorithm=grpo_guard", "train.std_mode=global", "runtime.mode=naive"])


def test_an_algorithm_change_is_refused_on_resume():
    from digenrl.train.resume_config import check_resume_config, config_hash

    saved = load_config(None, SMALL).model_dump(mode="json")
    for algo in ("grpo_guard", "mixgrpo", "nft"):
        cfg = load_config(None, [*SMALL, f"train.algorithm={algo}"])
        assert config_hash(cfg) != config_hash(saved)
        with pytest.raises(ConfigError, match="train.algorithm"):
            check_resume_config(saved, cfg)
    cfg = load_config(None, [*SMALL, *MIX])
    with pytest.raises(ConfigError, match="train.window_shift_interval"):
        check_resume_config(cfg.model_dump(mode="json"), load_config(None, [*SMALL, *MIX, "train.window_shift_interval=2"]))
    check_resume_config(saved, load_config(None, SMALL))  # the default stays resumable


# ---- MixGRPO: the plan, the sampler and the cost model know S = window size ---------------------------------
def test_mixgrpo_plan_trains_the_window_only():
    from digenrl.control.run_plan import plan_run, timestep_plan

    cfg = load_config(None, [*SMALL, *MIX, "runtime.mode=gap_tsp"])
    windows = [timestep_plan(cfg, k).trained for k in range(6)]
    assert windows == [(0, 1), (1, 2), (2, 3), (2, 3), (2, 3), (0, 1)]  # M = 4: starts 0..4, clamped to 2
    assert all(timestep_plan(cfg, k).sde_steps == w for k, w in enumerate(windows))
    run = plan_run(cfg)
    assert run.trained_timesteps == 2 and run.plan.trained_timesteps == 2  # the scheduler's and simulator's S


def test_mixgrpo_simulator_prices_window_cells():
    """`digenrl simulate --config` builds its workload from plan_run: the trained share is w / T."""
    from digenrl.control.run_plan import plan_run
    from digenrl.sim.from_config import config_workload

    mix = load_config(None, [*SMALL, *MIX, "model.kind=sd3", "sampler.num_steps=10"])
    assert config_workload(mix, plan_run(mix).trained_timesteps).timestep_fraction == pytest.approx(2 / 10)


def test_mixgrpo_ode_steps_record_no_trained_cells(tiny_policy):
    cfg, ctx = _ctx(tiny_policy, *MIX)
    for step in (0, 2):
        batch = _batch(ctx, cfg, step)
        window = ctx.plan(step).trained
        assert batch.trained_steps.tolist() == list(window)
        assert batch.latents.shape[1] == batch.next_latents.shape[1] == batch.log_probs.shape[1] == 2
        assert batch.means is None  # only grpo_guard keeps the means
        assert (batch.log_probs != 0).all()  # the window's steps are SDE steps
    # outside the window the steps are ODE: the SDE noise of those steps does not change the sample
    from digenrl.algo.timesteps import TimestepPlan
    from digenrl.rollout.sampler import sample_trajectories

    prompts = ctx.task.train_prompts(0, 1, cfg.seed)
    a = sample_trajectories(ctx.policy, prompts, [0], step=0, run_seed=cfg.seed, version=0, settings=ctx.sampler,
                            plan=ctx.plan(0), decode=False)
    b = sample_trajectories(ctx.policy, prompts, [0], step=0, run_seed=cfg.seed, version=0, settings=ctx.sampler,
                            plan=TimestepPlan(sde_steps=(0, 1), trained=(0, 1)), decode=False)
    assert torch.equal(a.final, b.final)


def test_mixgrpo_run_trains_window_cells(tiny_policy):
    from product import product_steps

    cfg = load_config(None, [*SMALL, *MIX])
    _, rows = product_steps(cfg, policy=tiny_policy, steps=3)
    assert [row["cells"] for row in rows] == [2 * 4 * 2] * 3  # P x G x w


# ---- GRPO-Guard: the sampler records the behaviour means, the loss is the reference's ------------------------
def test_grpo_guard_sampler_records_the_behaviour_means(tiny_policy):
    from digenrl.algo.sde import sde_step_with_logprob
    from digenrl.models.base import guided_velocity

    cfg, ctx = _ctx(tiny_policy, "train.algorithm=grpo_guard", "train.timestep_fraction=0.5")
    batch = _batch(ctx, cfg)
    assert batch.means is not None and batch.means.shape == batch.latents.shape
    sub = batch.select([1, 2])
    assert torch.equal(sub.means, batch.means[[1, 2]])
    ctx.policy.eval()
    with torch.no_grad():  # the recorded mean is the mean of the recorded transition under the behaviour policy
        j, step = 1, int(batch.trained_steps[1])
        x = batch.latents[:, j]
        cond = ctx.policy.encode_prompts(batch.prompts)
        v = guided_velocity(ctx.policy, x, batch.sigmas[step].expand(len(batch)), cond, 1.0)
        out = sde_step_with_logprob(x, v, batch.sigmas[step], batch.sigmas[step + 1], noise_level=0.7,
                                    prev_sample=batch.next_latents[:, j])
    torch.testing.assert_close(batch.means[:, j], out.mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(batch.log_probs[:, j], out.log_prob, rtol=1e-5, atol=1e-5)


def test_grpo_guard_cells_give_the_reference_gradient(tiny_policy):
    """train_cells with grpo_guard and ``train.guard_bias=cell`` accumulates the gradient of the rationorm loss
    with each cell's own bias (the paper's per-sample formula, written here; the default batch mean of flow_grpo
    is tests/train/test_reference_forms.py's)."""
    from digenrl.algo.sde import sde_step_with_logprob
    from digenrl.models.base import guided_velocity
    from digenrl.train.chunk_loss import train_cells

    cfg, ctx = _ctx(tiny_policy, "train.algorithm=grpo_guard", "train.timestep_fraction=0.5",
                    "train.clip_range=1e-3", "train.filter_zero_advantage=false", "train.guard_bias=cell")
    batch = _batch(ctx, cfg)
    with torch.no_grad():  # move the weights off the behaviour policy so the ratio leaves 1
        for p in ctx.policy.parameters():
            p.add_(1e-2 * torch.randn_like(p))
    cells = [(g, t) for g in range(4) for t in range(batch.latents.shape[1])]
    group = batch.select(list(range(4)))
    ctx.policy.zero_grad()
    stats = train_cells(ctx.policy, group, cells, settings=ctx.loss, loss_scale=0.125)
    got = [p.grad.clone() for p in ctx.policy.parameters()]

    ctx.policy.zero_grad()
    total = 0.0
    clip = cfg.train.clip_range
    for g, t in cells:
        step = int(group.trained_steps[t])
        sig, nxt = group.sigmas[step], group.sigmas[step + 1]
        x = group.latents[g:g + 1, t]
        cond = ctx.policy.encode_prompts([group.prompts[g]])
        v = guided_velocity(ctx.policy, x, sig.reshape(1), cond, 1.0)
        out = sde_step_with_logprob(x, v, sig, nxt, noise_level=0.7, prev_sample=group.next_latents[g:g + 1, t])
        s_t = 0.7 * math.sqrt(float(sig) / (1 - float(nxt if sig == 1 else sig)))  # flow_grpo: sigma_max at sigma = 1
        sqrt_dt = math.sqrt(float(sig - nxt))
        bias = (out.mean - group.means[g:g + 1, t]).pow(2).mean() / (2 * (sqrt_dt * s_t) ** 2)
        ratio = torch.exp((out.log_prob - group.log_probs[g, t] + bias) * (sqrt_dt * s_t))
        a = group.advantages[g]
        loss = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 1 - clip, 1 + clip)).mean() / sqrt_dt**2
        total = total + loss
    (total * 0.125).backward()
    want = [p.grad for p in ctx.policy.parameters()]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-9)
    assert stats.trained == len(cells) and stats.clipfrac > 0  # the clip acted on some cells
    assert any(float(a.abs().max()) > 0 for a in got)


def test_grpo_guard_run_on_policy_ratio_is_one(tiny_policy):
    from product import product_steps

    cfg = load_config(None, [*SMALL, "train.algorithm=grpo_guard", "train.timestep_fraction=0.5"])
    _, (row,) = product_steps(cfg, policy=tiny_policy, steps=1)
    assert row["approx_kl"] == 0.0 and row["clipfrac"] == 0.0 and row["cells"] == 2 * 4 * 3
    assert math.isfinite(row["loss"]) and row["grad_norm"] > 0


# ---- MixGRPO-Flash: DPM-Solver++ 2M after the window on a compressed schedule -------------------------------
FLASH = ["sampler.num_steps=8", "sampler.static_shift=3", "sampler.post_solver=dpmpp_2m",
         "sampler.post_compress_ratio=0.5"]


@pytest.mark.parametrize("overrides,match", [
    (["sampler.post_solver=dpmpp_2m"], "sampler.post_solver"),
    ([*MIX, "sampler.post_compress_ratio=0.4"], "sampler.static_shift"),
])
def test_flash_configs_are_refused_naming_the_key(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, [*SMALL, *overrides])


def test_flash_sampler_trains_the_same_cells_on_a_shorter_ode(tiny_policy, monkeypatch):
    from digenrl.algo.dpm import post_window_sigmas
    from digenrl.rollout.sampler import sample_trajectories

    cfg, ctx = _ctx(tiny_policy, *MIX, *FLASH)
    _, ctx_euler = _ctx(tiny_policy, *MIX, *[o for o in FLASH if "post_" not in o])
    prompts = ctx.task.train_prompts(0, 2, cfg.seed)
    calls = []
    forward = type(ctx.policy).forward
    monkeypatch.setattr(type(ctx.policy), "forward", lambda self, *a, **k: calls.append(1) or forward(self, *a, **k))
    kw = dict(step=0, run_seed=cfg.seed, version=0, plan=ctx.plan(0), decode=False)
    flash = sample_trajectories(ctx.policy, prompts, [0, 1], settings=ctx.sampler, **kw)
    n_flash = len(calls)
    euler = sample_trajectories(ctx_euler.policy, prompts, [0, 1], settings=ctx_euler.sampler, **kw)
    assert ctx.plan(0).trained == (0, 1)
    # L = 1: n_post = int(7 * 0.5) = 3 points, so 1 + 3 = 4 steps instead of 8 (one forward each)
    torch.testing.assert_close(flash.sigmas, post_window_sigmas(8, 1, 3.0, 0.5))
    assert len(flash.sigmas) == 5 and n_flash == 4 and len(calls) - n_flash == 8
    for name in ("latents", "next_latents", "log_probs"):  # the window's cells are those of the Euler tail
        assert torch.equal(getattr(flash, name), getattr(euler, name)), name
    assert torch.isfinite(flash.final).all() and not torch.allclose(flash.final, euler.final)
    # evaluation (no SDE step) keeps the Euler ODE on the whole schedule
    from digenrl.algo.timesteps import TimestepPlan

    calls.clear()
    ev = sample_trajectories(ctx.policy, prompts, [0, 1], settings=ctx.sampler, **{**kw, "plan": TimestepPlan((), ())})
    assert len(calls) == 8 and len(ev.sigmas) == 9


def test_flash_run_trains(tiny_policy):
    from product import product_steps

    cfg = load_config(None, [*SMALL, *MIX, *FLASH])
    _, rows = product_steps(cfg, policy=tiny_policy, steps=2)
    assert all(row["cells"] == 2 * 4 * 2 and row["grad_norm"] > 0 for row in rows)
