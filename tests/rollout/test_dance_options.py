"""DanceGRPO's schedule and model timesteps, and the detached unconditional CFG branch, against their formulas."""

import torch

from digenrl.algo.timesteps import select_timesteps
from digenrl.models.base import guided_velocity
from digenrl.rollout.records import Prompt
from digenrl.rollout.sampler import SamplerSettings, sample_trajectories, static_shift_sigmas


def test_static_shift_is_dance_schedule():
    t = torch.linspace(1, 0, 16 + 1)  # train_grpo_flux.py: sd3_time_shift(args.shift, linspace(1, 0, T + 1))
    torch.testing.assert_close(static_shift_sigmas(16, 3.0), (3.0 * t) / (1 + (3.0 - 1) * t), rtol=0, atol=0)


class _Spy(torch.nn.Module):
    """A velocity model that records the sigmas it is given."""

    latent_shape = (1, 2, 2)
    uses_guidance_embedding = False

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(0.5))
        self.seen = []

    def forward(self, x, sigma, cond):
        self.seen.append(sigma.clone())
        return self.w * x + cond["c"].view(-1, 1, 1, 1)

    def encode_prompts(self, prompts):
        return {"c": torch.ones(len(prompts))}

    def null_cond(self, n):
        return {"c": torch.zeros(n)}

    def combine_guidance(self, u, c, w):
        return u + w * (c - u)

    def sigmas(self, n):
        return static_shift_sigmas(n, 3.0)

    def decode(self, x):
        return x


def test_integer_model_timesteps_are_dance_timesteps():
    spy = _Spy()
    s = SamplerSettings(num_steps=6, noise_level=0.3, kind="dance", integer_timesteps=True, static_shift=3.0)
    b = sample_trajectories(spy, [Prompt(0, "a")], [0], step=0, run_seed=0, version=0, settings=s,
                            plan=select_timesteps(6, fraction=0.5))
    sched = static_shift_sigmas(6, 3.0)
    want = [int(sig * 1000) / 1000 for sig in sched[:6]]  # run_sample_step: int(sigma * 1000), then / 1000
    got = [float(x[0]) for x in spy.seen]
    assert got == [float(torch.tensor(w, dtype=torch.float32)) for w in want]
    torch.testing.assert_close(b.sigmas, sched)  # the SDE step keeps the exact sigmas


def test_detached_unconditional_branch_gradient():
    spy = _Spy()
    x = torch.randn(2, 1, 2, 2)
    sig = torch.full((2,), 0.5)
    cond = spy.encode_prompts([0, 1])
    guided_velocity(spy, x, sig, cond, 4.0, detach_uncond=True).sum().backward()
    got = spy.w.grad.clone()
    spy.w.grad = None
    (4.0 * spy(x, sig, cond)).sum().backward()  # only the conditional branch carries gradient, times w
    torch.testing.assert_close(got, spy.w.grad)
    spy.w.grad = None
    guided_velocity(spy, x, sig, cond, 4.0).sum().backward()
    assert not torch.allclose(spy.w.grad, got)  # without detaching, the unconditional branch counts (1 - w)
