"""Invariant I5: a trajectory's noise depends only on (run seed, step, prompt uid, generation index)."""

import torch

from digenrl.algo.timesteps import select_timesteps
from digenrl.rollout.sampler import SamplerSettings, sample_trajectories
from digenrl.tasks.digits import DigitsTask


def _sample(policy, prompts, gens, **kw):
    plan = select_timesteps(6, fraction=0.5)
    return sample_trajectories(policy, prompts, gens, step=3, run_seed=7, version=0,
                               settings=SamplerSettings(num_steps=6, noise_level=0.8, **kw), plan=plan)


def test_trajectory_alone_equals_inside_larger_batch(tiny_policy):
    prompts = DigitsTask().train_prompts(0, 4, seed=0)
    rep = [p for p in prompts for _ in range(3)]
    gens = [g for _ in prompts for g in range(3)]
    big = _sample(tiny_policy, rep, gens)
    # the same trajectory, alone, and in a different split / order
    alone = _sample(tiny_policy, [rep[5]], [gens[5]])
    torch.testing.assert_close(alone.final[0], big.final[5], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(alone.log_probs[0], big.log_probs[5], rtol=1e-5, atol=1e-5)
    rev = _sample(tiny_policy, rep[::-1], gens[::-1])
    torch.testing.assert_close(rev.final.flip(0), big.final, rtol=1e-5, atol=1e-6)


def test_noise_differs_between_generations_steps_and_seeds(tiny_policy):
    p = DigitsTask().train_prompts(0, 1, seed=0)
    a = _sample(tiny_policy, p * 2, [0, 1])
    assert not torch.allclose(a.final[0], a.final[1])
    b = sample_trajectories(tiny_policy, p, [0], step=4, run_seed=7, version=0,
                            settings=SamplerSettings(num_steps=6, noise_level=0.8), plan=select_timesteps(6, fraction=0.5))
    assert not torch.allclose(a.final[0], b.final[0])


def test_recorded_logprob_matches_recomputation_and_cfg(tiny_policy):
    """Behaviour log-probs equal a fresh evaluation of the same transitions (ratio 1 on-policy), with CFG."""
    from digenrl.algo.sde import sde_step_with_logprob
    from digenrl.models.base import guided_velocity

    prompts = DigitsTask().train_prompts(0, 2, seed=0)
    tb = _sample(tiny_policy, prompts, [0, 1], cfg_scale=2.5)
    cond = tiny_policy.encode_prompts(prompts)
    for j, i in enumerate(tb.trained_steps.tolist()):
        x = tb.latents[:, j]
        sig = tb.sigmas[i].expand(2)
        with torch.no_grad():
            v_c = tiny_policy(x, sig, cond)
            v_u = tiny_policy(x, sig, tiny_policy.null_cond(2))
            v = guided_velocity(tiny_policy, x, sig, cond, 2.5)
        torch.testing.assert_close(v, v_u + 2.5 * (v_c - v_u), rtol=1e-5, atol=1e-6)
        out = sde_step_with_logprob(x, v, tb.sigmas[i], tb.sigmas[i + 1], noise_level=0.8, prev_sample=tb.next_latents[:, j])
        torch.testing.assert_close(out.log_prob, tb.log_probs[:, j], rtol=1e-5, atol=1e-5)
