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


# ---- I5: the noise is a function of (run seed, step, prompt uid, generation index), and of nothing else ----


def _one(policy, prompt, gen, *, step=3, run_seed=7):
    return sample_trajectories(policy, [prompt], [gen], step=step, run_seed=run_seed, version=0,
                               settings=SamplerSettings(num_steps=6, noise_level=0.8),
                               plan=select_timesteps(6, fraction=0.5))


def _differ(a, b):
    return not torch.allclose(a.final, b.final) and not torch.allclose(a.latents, b.latents)


def test_noise_changes_with_the_run_seed(tiny_policy):
    p = DigitsTask().train_prompts(0, 1, seed=0)[0]
    a, b = _one(tiny_policy, p, 0, run_seed=7), _one(tiny_policy, p, 0, run_seed=8)
    assert _differ(a, b)
    torch.testing.assert_close(_one(tiny_policy, p, 0, run_seed=7).final, a.final, rtol=0, atol=0)


def test_noise_changes_with_the_prompt_uid(tiny_policy):
    # the same prompt text under another uid: the conditioning is identical, only the uid (hence the noise) differs
    from dataclasses import replace

    p = DigitsTask().train_prompts(0, 1, seed=0)[0]
    q = replace(p, uid=p.uid + 1)
    cp, cq = tiny_policy.encode_prompts([p]), tiny_policy.encode_prompts([q])
    assert cp.keys() == cq.keys() and all(torch.equal(cp[k], cq[k]) for k in cp)
    assert _differ(_one(tiny_policy, p, 0), _one(tiny_policy, q, 0))


def test_noise_changes_with_the_generation_index_and_the_step(tiny_policy):
    p = DigitsTask().train_prompts(0, 1, seed=0)[0]
    a = _one(tiny_policy, p, 0)
    assert _differ(a, _one(tiny_policy, p, 1))
    assert _differ(a, _one(tiny_policy, p, 0, step=4))


def test_the_recorded_seed_is_the_i5_seed(tiny_policy):
    from digenrl.algo.timesteps import stable_seed

    prompts = DigitsTask().train_prompts(0, 2, seed=0)
    b = sample_trajectories(tiny_policy, [prompts[1], prompts[0]], [3, 1], step=5, run_seed=11, version=0,
                            settings=SamplerSettings(num_steps=6, noise_level=0.8), plan=select_timesteps(6, fraction=0.5))
    assert b.seed.tolist() == [stable_seed(11, 5, prompts[1].uid, 3), stable_seed(11, 5, prompts[0].uid, 1)]


def test_any_worker_and_fragment_split_make_the_same_trajectory(tiny_policy, tmp_path):
    """Two generator workers (different names), the group split into different fragments: generation 2 of the
    group is the same trajectory whichever worker and fragment produced it."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
    from runtime_helpers import make_cfg

    from digenrl.runtime.generator import GeneratorWorker
    from digenrl.schedule import Fragment

    model = tmp_path / "tiny.safetensors"
    tiny_policy.save(model)
    conf = make_cfg(model, tmp_path / "run", "runtime.mode=gap").model_dump(mode="json")
    w0, w1 = GeneratorWorker("gen0", conf), GeneratorWorker("gen1", conf)
    w0.version = w1.version = 0  # both hold the weights of the same file
    whole, _ = w0.generate(Fragment(0, 1, (0, 1, 2, 3)), 0)
    part, info = w1.generate(Fragment(0, 1, (2, 3)), 0)
    alone, _ = w1.generate(Fragment(0, 1, (2,)), 0)
    assert info.worker == "gen1"
    for b in (part, alone):
        torch.testing.assert_close(b.latents[0], whole.latents[2], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b.log_probs[0], whole.log_probs[2], rtol=1e-5, atol=1e-5)
        assert b.seed[0] == whole.seed[2]
    # another group (another uid) of the same step: other noise
    other, _ = w0.generate(Fragment(0, 0, (2,)), 0)
    assert other.seed[0] != whole.seed[2]
