"""DanceGRPO's per-reward advantages (train_grpo_hunyuan.py, vq / mq): each reward part normalised in its group
with (r - mean) / (std + 1e-8), and loss = sum_k coef_k mean(max(-A_k r, -A_k clip(r))) / (GA * S)."""

import copy

import torch

from digenrl.algo.deferred_std import AdvOptions
from digenrl.algo.sde import sde_step_with_logprob
from digenrl.algo.timesteps import select_timesteps
from digenrl.rollout.sampler import SamplerSettings
from digenrl.tasks.digits import DigitsTask
from digenrl.train.chunk_loss import LossSettings, train_cells
from digenrl.train.step_math import assign_advantages, generate, kept_count


def test_per_reward_loss_gradient_matches_dance_formula(tiny_policy):
    prompts = DigitsTask().train_prompts(0, 1, seed=0)
    batch = generate(tiny_policy, prompts * 4, [0, 1, 2, 3], step=0, run_seed=2, version=0,
                     settings=SamplerSettings(num_steps=4, noise_level=0.3, kind="dance"), plan=select_timesteps(4, fraction=0.5))
    g = torch.Generator().manual_seed(0)
    vq, mq = torch.rand(4, generator=g), torch.rand(4, generator=g)
    batch.rewards, batch.reward_parts = 0.7 * vq + 0.3 * mq, {"vq": vq, "mq": mq}
    assign_advantages(batch, AdvOptions(unbiased=True, eps=1e-8, per_reward=True))
    assert batch.advantages.shape == (4, 2) and kept_count(batch.advantages, True) == 4
    S, clip, coef = 2, 1e-4, (0.7, 0.3)
    ref_model = copy.deepcopy(tiny_policy)
    # move the policy so that r != 1 and the clip matters
    with torch.no_grad():
        for p in tiny_policy.parameters():
            p.add_(1e-3 * torch.randn(p.shape, generator=g))
        for p, q in zip(ref_model.parameters(), tiny_policy.parameters()):
            p.copy_(q)
    cond = ref_model.encode_prompts(batch.prompts)
    for k, (name, r) in enumerate((("vq", vq), ("mq", mq))):
        a = (r - r.mean()) / (r.std() + 1e-8)
        torch.testing.assert_close(batch.advantages[:, k], a)
    a_vq = ((vq - vq.mean()) / (vq.std() + 1e-8)).clamp(-5, 5)
    a_mq = ((mq - mq.mean()) / (mq.std() + 1e-8)).clamp(-5, 5)
    for j in range(S):
        i = int(batch.trained_steps[j])
        x = batch.latents[:, j]
        out = sde_step_with_logprob(x, ref_model(x, batch.sigmas[i].expand(4), cond), batch.sigmas[i], batch.sigmas[i + 1],
                                    noise_level=0.3, kind="dance", prev_sample=batch.next_latents[:, j])
        ratio = torch.exp(out.log_prob - batch.log_probs[:, j])
        loss = sum(c * torch.mean(torch.maximum(-a * ratio, -a * ratio.clamp(1 - clip, 1 + clip))) / S
                   for c, a in zip(coef, (a_vq, a_mq)))
        loss.backward()
    settings = LossSettings(noise_level=0.3, kind="dance", clip_range=clip, adv_weights=coef, filter_zero_advantage=True)
    train_cells(tiny_policy, batch, [(gen, t) for gen in range(4) for t in range(S)], settings=settings, loss_scale=1 / (4 * S))
    assert sum(float(q.grad.norm()) for q in ref_model.parameters() if q.grad is not None) > 0
    for p, q in zip(tiny_policy.parameters(), ref_model.parameters()):
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-8)
