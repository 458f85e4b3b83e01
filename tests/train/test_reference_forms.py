"""The three algorithms as their authors run them (issue 40), each against its reference written out here, off
policy (where the other form differs), so that each test fails on the other form:

* MixGRPO's ``advantage_aggr`` (``fastvideo/train_grpo_flux.py``): A = clamp(sum_k w_k A_k, -c, c) and ONE clipped
  loss (``train.reward_aggregation=advantages``, mixgrpo's default), not sum_k w_k L(A_k) (``losses``);
* GRPO-Guard's RatioNorm bias as flow_grpo computes it (``scripts/train_sd3_GRPO_Guard.py``):
  ``(mean - old_mean).pow(2).mean(dim=tuple(range(1, log_prob.ndim)))`` on a 1-D ``log_prob``, i.e. one mean over
  the device's batch of the timestep (``train.guard_bias=batch``, the default), not per cell (``cell``);
* DiffusionNFT's model time: int(sigma * 1000) / 1000 while sampling, float sigma in training
  (``sampler.integer_timesteps=sampling``), not integer in both (``true``);
* MixGRPO's minibatches: an optimizer step takes a block of generations of every prompt
  (``train.minibatch_split=generations``).

Each form also runs through the product's one path against the I1 reference (``tests/reference``, which writes
them again from the same sources): ``tests/train/test_i1_in_process.py``.

The SDE step and its log-density are written here from the formulas (docs/architecture.md, "The math"), not
imported."""

from __future__ import annotations

import copy

import pytest
import torch

from digenrl.algo.deferred_std import AdvOptions
from digenrl.algo.timesteps import select_timesteps
from digenrl.rollout.sampler import SamplerSettings
from digenrl.tasks.digits import DigitsTask
from digenrl.train.chunk_loss import LossSettings, train_cells
from digenrl.train.step_math import assign_advantages, generate
from train_helpers import sde_reference


_sde = sde_reference


def _batch(policy, n, *, a=0.7, steps=4, record_means=False, run_seed=3):
    prompts = DigitsTask().train_prompts(0, 1, seed=0)
    return generate(policy, prompts * n, list(range(n)), step=0, run_seed=run_seed, version=0,
                    settings=SamplerSettings(num_steps=steps, noise_level=a, record_means=record_means),
                    plan=select_timesteps(steps, fraction=0.5))


def _moved(policy, scale, seed=0):
    """(policy moved off the behaviour weights, a copy of it for the reference): the ratio leaves 1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return copy.deepcopy(policy)


def _grads(model):
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _rel(a, b):
    return max(float((x - y).norm() / y.norm().clamp_min(1e-30)) for x, y in zip(a, b))


# ---- MixGRPO: one clipped loss of the clamped weighted advantage ------------------------------------------------
@pytest.mark.parametrize("aggregation", ["advantages", "losses"])
def test_mixgrpo_aggregates_advantages_before_the_clipped_loss(tiny_policy, aggregation):
    """train_grpo_flux.py (multi_reward_mix="advantage_aggr"): per reward k the group advantage (r - mean) /
    (std + 1e-8) (torch std, n - 1), A = sum_k w_k A_k, A = clamp(A, -adv_clip_max, adv_clip_max), loss = mean of
    max(-A r, -A clip(r, 1 - eps, 1 + eps)) / S. Off policy, with a clip range the ratios leave, the per-reward
    losses sum_k w_k L(A_k) give another gradient; and with |sum w_k A_k| above adv_clip_max only the sum's clamp
    is the reference's."""
    n, S, clip, c = 6, 2, 1e-4, 0.7  # c < the largest |sum w A|: the clamp acts on the sum
    batch = _batch(tiny_policy, n)
    g = torch.Generator().manual_seed(5)
    parts = {"hps": torch.rand(n, generator=g), "pick": torch.rand(n, generator=g)}
    w = (0.6, 0.4)
    batch.rewards, batch.reward_parts = w[0] * parts["hps"] + w[1] * parts["pick"], parts
    assign_advantages(batch, AdvOptions(clip=c, unbiased=True, eps=1e-8, per_reward=True,
                                        clip_parts=aggregation == "losses"))
    ref = _moved(tiny_policy, 3e-3)
    adv_k = [(r - r.mean()) / (r.std() + 1e-8) for r in parts.values()]
    A = (w[0] * adv_k[0] + w[1] * adv_k[1]).clamp(-c, c)
    assert float((w[0] * adv_k[0] + w[1] * adv_k[1]).abs().max()) > c  # the clamp of the sum matters
    cond = ref.encode_prompts(batch.prompts)
    leaves = 0
    for j in range(S):
        i = int(batch.trained_steps[j])
        x, s0, s1 = batch.latents[:, j], float(batch.sigmas[i]), float(batch.sigmas[i + 1])
        _, _, lp = _sde(x, ref(x, batch.sigmas[i].expand(n), cond), s0, s1, 0.7, batch.next_latents[:, j])
        ratio = torch.exp(lp - batch.log_probs[:, j])
        leaves += int(((ratio - 1).abs() > clip).sum())
        (torch.maximum(-A * ratio, -A * ratio.clamp(1 - clip, 1 + clip)).mean() / S).backward()
    assert leaves >= 2  # off policy: the clip acts, which is where the two forms differ
    settings = LossSettings(clip_range=clip, adv_weights=w, reward_aggregation=aggregation, adv_clip_max=c)
    train_cells(tiny_policy, batch, [(k, j) for k in range(n) for j in range(S)], settings=settings,
                loss_scale=1 / (n * S))
    err = _rel(_grads(tiny_policy), _grads(ref))
    if aggregation == "advantages":
        assert err < 1e-4, err
    else:  # the per-reward losses are another gradient off policy
        assert err > 1e-2, err


def test_mixgrpo_defaults_to_the_aggregated_advantage_and_dance_to_the_losses():
    from digenrl.config import load_config
    from digenrl.train.context import loss_settings

    mix = load_config(None, ["train.algorithm=mixgrpo", "sampler.num_steps=6", "train.adv_per_reward=true"])
    plain = load_config(None, ["train.adv_per_reward=true"])
    assert loss_settings(mix).reward_aggregation == "advantages"
    assert loss_settings(plain).reward_aggregation == "losses"
    chosen = load_config(None, ["train.adv_per_reward=true", "train.reward_aggregation=advantages"])
    assert loss_settings(chosen).reward_aggregation == "advantages"
    with pytest.raises(ValueError, match="train.reward_aggregation"):
        load_config(None, ["train.reward_aggregation=losses"])


# ---- GRPO-Guard: the bias averaged over the device's batch of a timestep ----------------------------------------
@pytest.mark.parametrize("bias", ["batch", "cell"])
def test_grpo_guard_bias_is_the_batch_mean_of_flow_grpo(tiny_policy, bias):
    """scripts/train_sd3_GRPO_Guard.py, per timestep j of a batch of samples (one forward, one sigma)::

        log_prob, mean = sde_step(...)   # log_prob [B] (1-D)
        bias = (mean - old_mean).pow(2).mean(dim=tuple(range(1, log_prob.ndim))) / (2 * std**2)   # a scalar
        ratio = exp((log_prob - old_log_prob + bias) * std)
        loss = max(-A ratio, -A clip(ratio, 1 - eps, 1 + eps)) / (-dt)

    One chunk of 4 generations x 2 timesteps is the batch of each timestep. The samples drift apart (off policy),
    so the batch mean and the per-cell bias give different gradients."""
    n, S, clip = 4, 2, 0.2
    batch = _batch(tiny_policy, n, record_means=True)
    batch.rewards = torch.tensor([0.1, 0.9, 0.4, 0.7])
    assign_advantages(batch)
    ref = _moved(tiny_policy, 2e-2, seed=4)
    cond = ref.encode_prompts(batch.prompts)
    for j in range(S):
        i = int(batch.trained_steps[j])
        x, s0, s1 = batch.latents[:, j], float(batch.sigmas[i]), float(batch.sigmas[i + 1])
        mean, std, lp = _sde(x, ref(x, batch.sigmas[i].expand(n), cond), s0, s1, 0.7, batch.next_latents[:, j])
        old_mean = batch.means[:, j]
        log_prob = lp
        assert log_prob.ndim == 1
        b = (mean - old_mean).pow(2).mean(dim=tuple(range(1, log_prob.ndim))) / (2 * std**2)
        assert b.ndim == 0  # torch reads the empty tuple of dims as every dim: one bias for the batch
        ratio = torch.exp((log_prob - batch.log_probs[:, j] + b) * std)
        A = batch.advantages
        (torch.maximum(-A * ratio, -A * ratio.clamp(1 - clip, 1 + clip)) / (s0 - s1)).sum().backward()
    settings = LossSettings(clip_range=clip, algorithm="grpo_guard", guard_bias=bias)
    train_cells(tiny_policy, batch, [(k, j) for j in range(S) for k in range(n)], settings=settings, loss_scale=1.0)
    err = _rel(_grads(tiny_policy), _grads(ref))
    if bias == "batch":
        assert err < 1e-4, err
    else:  # each cell's own bias: the same on policy, another gradient here
        assert err > 1e-3, err


def test_grpo_guard_bias_key_is_validated():
    from digenrl.config import load_config
    from digenrl.train.context import loss_settings

    assert loss_settings(load_config(None, ["train.algorithm=grpo_guard"])).guard_bias == "batch"
    with pytest.raises(ValueError, match="train.guard_bias"):
        load_config(None, ["train.guard_bias=cell"])


# ---- DiffusionNFT: integer model time while sampling only --------------------------------------------------------
class _Spy(torch.nn.Module):
    """A policy that records the model time of every forward, in training (grad enabled) or not."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.seen = inner, []

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner, name)

    def forward(self, x, sigma, cond, **kw):
        self.seen.append((torch.is_grad_enabled(), sigma.detach().clone()))
        return self.inner(x, sigma, cond, **kw)


@pytest.mark.parametrize("setting", ["sampling", True])
def test_nft_integer_time_only_while_sampling(tiny_policy, setting):
    """DiffusionNFT feeds SD3 int(sigma * 1000) when it samples and the float t of the noised sample in training:
    sampler.integer_timesteps=sampling. With ``true`` the training forward would see integer time too."""
    from digenrl.config import load_config
    from digenrl.train.context import loss_settings, sampler_settings
    from digenrl.train.step_math import assign_advantages as assign
    from digenrl.train.step_math import generate as gen

    cfg = load_config(None, ["train.algorithm=nft", "sampler.num_steps=5", f"sampler.integer_timesteps={setting}"])
    spy = _Spy(tiny_policy)
    prompts = DigitsTask().train_prompts(0, 1, seed=0)
    from digenrl.control.run_plan import timestep_plan

    batch = gen(spy, prompts * 3, [0, 1, 2], step=0, run_seed=1, version=0, settings=sampler_settings(cfg),
                plan=timestep_plan(cfg, 0))
    sampled = [s for grad, s in spy.seen if not grad]
    assert sampled and all(torch.equal(s, torch.floor(s * 1000) / 1000) for s in sampled)
    assert not torch.equal(batch.sigmas, torch.floor(batch.sigmas * 1000) / 1000)  # the schedule is off the grid
    batch.rewards = torch.tensor([0.2, 0.5, 0.9])
    assign(batch)
    spy.seen.clear()
    settings = loss_settings(cfg)
    train_cells(spy, batch, [(k, j) for k in range(3) for j in range(2)], settings=settings, loss_scale=1.0)
    trained = torch.cat([s.reshape(-1) for grad, s in spy.seen if grad])
    on_grid = torch.equal(trained, torch.floor(trained * 1000) / 1000)
    assert on_grid == (setting is True)  # "sampling": float time in training (a draw off the 1/1000 grid)


def test_integer_time_at_sampling_only_needs_nft():
    from digenrl.config import load_config

    with pytest.raises(ValueError, match="sampler.integer_timesteps"):
        load_config(None, ["sampler.integer_timesteps=sampling"])


# ---- MixGRPO's minibatches: a block of every prompt's generations -----------------------------------------------
def test_generation_minibatches_take_every_prompt(tiny_policy, monkeypatch):
    """MixGRPO: one prompt per GPU, 12 generations, optimizer.step() every 3 samples: optimizer step m trains
    generations 3m, 3m + 1, 3m + 2 of every prompt. Here G = 6, M = 3: step m trains generations 2m, 2m + 1 of each
    of the 4 groups (the groups split of the default would train 1-2 whole groups per step). The product's one
    path in this process (``tests/product.py``): the cells each round's forwards get."""
    import digenrl.train.chunk_loss as chunk_loss
    from digenrl.config import load_config
    from product import product_steps, product_worker

    cfg = load_config(None, ["steps=1", "train.prompts_per_step=4", "train.generations=6",
                             "train.minibatches_per_step=3", "train.minibatch_split=generations", "sampler.num_steps=4",
                             "train.chunk_generations=4", "train.filter_zero_advantage=false", "eval.every=0",
                             "log.progress=false"])
    worker = product_worker(cfg, policy=tiny_policy)
    trained: dict[int, set] = {}
    real = chunk_loss.train_cells

    def spy(policy, group, cells, **kw):  # the round: rounds the worker has committed in this step
        uid = group.prompts[0].uid
        trained.setdefault(worker._round, set()).update((uid, int(g), int(j)) for g, j in cells)
        return real(policy, group, cells, **kw)

    monkeypatch.setattr(chunk_loss, "train_cells", spy)
    product_steps(cfg, worker=worker)
    assert sorted(trained) == [0, 1, 2]
    uids = {u for u, _, _ in trained[0]}
    assert len(uids) == 4
    for m, cells in trained.items():
        assert cells == {(u, g, j) for u in uids for g in (2 * m, 2 * m + 1) for j in range(2)}, m


def test_generation_minibatches_mask_each_group_alone():
    """The Ray trainers' masks (train.sample_masks) for the same split: block floor(j M / G), from one group's
    rewards (a pipelined mode trains a group's block as soon as it is scored)."""
    from types import SimpleNamespace

    from digenrl.config import load_config
    from digenrl.train.sample_masks import round_masks

    cfg = load_config(None, ["train.prompts_per_step=4", "train.generations=6", "train.minibatches_per_step=3",
                             "train.minibatch_split=generations", "runtime.mode=gap_tsp_tag",
                             "train.filter_zero_advantage=false"])
    plan = SimpleNamespace(prompts=4, minibatches=3)
    rewards = {2: [0.1, 0.5, 0.2, 0.9, 0.3, 0.4]}  # one group in
    for r in range(3):
        mask = round_masks(cfg, plan, rewards, None, step=0, round=r)[2]
        assert mask.tolist() == [j // 2 == r for j in range(6)]
    with pytest.raises(ValueError, match="train.minibatches_per_step"):
        load_config(None, ["train.generations=6", "train.minibatches_per_step=7", "train.prompts_per_step=8",
                           "train.minibatch_split=generations"])
