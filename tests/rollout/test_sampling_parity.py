"""Sampling as Flow-GRPO does it: eval mode, the guidance embedding at the sampling scale in training too,
shared initial noise per prompt (same_latent), a separate eval guidance scale."""

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from digenrl.algo.timesteps import select_timesteps
from digenrl.rollout.records import Prompt
from digenrl.rollout.sampler import SamplerSettings, sample_trajectories

sys.path.insert(0, str(Path(__file__).parents[1] / "models"))


@pytest.fixture(scope="module")
def flux_dir(tmp_path_factory):
    import tiny_diffusers as td

    return td.save_flux(tmp_path_factory.mktemp("flux") / "flux")


def _flux(path, dropout=0.0):
    from digenrl.config import LoraConfig, ModelConfig
    from digenrl.models.registry import build_policy

    return build_policy(ModelConfig(kind="flux", path=str(path), lora=LoraConfig(enabled=True, rank=4, dropout=dropout),
                                    options={"height": 16, "width": 16, "max_sequence_length": 8}))


PROMPTS = [Prompt(uid=0, text="a red cat"), Prompt(uid=0, text="a red cat"), Prompt(uid=1, text="a blue dog"),
           Prompt(uid=1, text="a blue dog")]
GENS = [0, 1, 0, 1]


def test_sampling_runs_in_eval_mode(flux_dir):
    policy = _flux(flux_dir, dropout=0.5)
    policy.train()
    with torch.no_grad():  # make the adapters non-zero so that their dropout matters
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    s = SamplerSettings(num_steps=3, noise_level=0.7, cfg_scale=3.5)
    plan = select_timesteps(3, fraction=0.67)
    a = sample_trajectories(policy, PROMPTS, GENS, step=0, run_seed=1, version=0, settings=s, plan=plan, decode=False)
    b = sample_trajectories(policy, PROMPTS, GENS, step=0, run_seed=1, version=0, settings=s, plan=plan, decode=False)
    assert policy.training  # restored
    torch.testing.assert_close(a.final, b.final, rtol=0, atol=0)  # dropout off: deterministic given the seeds
    policy.eval()
    c = sample_trajectories(policy, PROMPTS, GENS, step=0, run_seed=1, version=0, settings=s, plan=plan, decode=False)
    torch.testing.assert_close(a.log_probs, c.log_probs, rtol=0, atol=0)


def test_flux_training_forward_uses_the_sampling_guidance(flux_dir):
    """cfg_in_training=false: the guidance embedding still gets sampler.cfg_scale, so on-policy r == 1."""
    from digenrl.algo.advantage import group_advantages
    from digenrl.config import load_config
    from digenrl.train.chunk_loss import train_cells
    from digenrl.train.context import loss_settings

    policy = _flux(flux_dir)
    cfg = load_config(None, ["sampler.cfg_scale=3.5", "train.cfg_in_training=false", "sampler.num_steps=3"])
    settings = loss_settings(cfg)
    assert settings.guidance == 3.5 and settings.cfg_scale == 1.0
    s = SamplerSettings(num_steps=3, noise_level=0.7, cfg_scale=3.5)
    batch = sample_trajectories(policy, PROMPTS[:2], GENS[:2], step=0, run_seed=2, version=0, settings=s,
                                plan=select_timesteps(3, fraction=0.67), decode=False)
    batch.advantages, _ = group_advantages(torch.tensor([0.0, 1.0]), batch.uids)
    cells = [(g, t) for g in (0, 1) for t in range(2)]
    on = train_cells(policy, batch, cells, settings=settings, loss_scale=1.0)
    assert on.approx_kl == 0.0
    old = train_cells(policy, batch, cells, settings=replace(settings, guidance=1.0), loss_scale=1.0)
    assert old.approx_kl > 0.0  # the previous behaviour (guidance 1.0 in training) is off-policy


def test_same_latent_shares_the_initial_noise_of_a_group(tiny_policy):
    prompts = [Prompt(uid=u, text=f"{u} left, blank right", meta={"left": u, "right": 10}) for u in (1, 1, 1, 2, 2, 2)]
    gens = [0, 1, 2, 0, 1, 2]
    s = SamplerSettings(num_steps=3, noise_level=0.7, same_latent=True)
    b = sample_trajectories(tiny_policy, prompts, gens, step=4, run_seed=3, version=0, settings=s,
                            plan=select_timesteps(3, fraction=0.34), decode=False)
    x_t = b.latents[:, 0]
    assert torch.equal(x_t[0], x_t[1]) and torch.equal(x_t[0], x_t[2]) and torch.equal(x_t[3], x_t[5])
    assert not torch.equal(x_t[0], x_t[3])
    assert not torch.equal(b.final[0], b.final[1])  # the SDE noise stays per generation
    alone = sample_trajectories(tiny_policy, prompts[4:5], gens[4:5], step=4, run_seed=3, version=0, settings=s,
                                plan=select_timesteps(3, fraction=0.34), decode=False)
    torch.testing.assert_close(alone.final[0], b.final[4])  # I5: independent of the batch


def test_eval_uses_eval_guidance_scale(tiny_policy, monkeypatch):
    from digenrl.rewards.base import WeightedSum
    from digenrl.train import evaluate as ev

    seen = []
    real = ev.generate

    def spy(*a, settings, **k):
        seen.append(settings)
        return real(*a, settings=settings, **k)

    monkeypatch.setattr(ev, "generate", spy)
    prompts = [Prompt(uid=1, text="1 left, blank right", meta={"left": 1, "right": 10})]
    reward = WeightedSum({"one": (1.0, lambda images, p: torch.ones(len(p)))})
    ev.evaluate(tiny_policy, prompts, reward, SamplerSettings(num_steps=2, cfg_scale=4.5, eval_cfg_scale=2.0), run_seed=0)
    assert seen[-1].cfg_scale == 2.0 and seen[-1].noise_level == 0.0
