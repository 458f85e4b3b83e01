"""Chunked training against a per-timestep reference, and the gradient transaction's rules."""

import pytest
import torch

from digenrl.algo.loss import clipped_policy_loss
from digenrl.algo.sde import sde_step_with_logprob
from digenrl.algo.timesteps import select_timesteps
from digenrl.rollout.sampler import SamplerSettings
from digenrl.tasks.digits import DigitsTask
from digenrl.train.chunk_loss import LossSettings
from digenrl.schedule.layout import tile_grid
from digenrl.train.step_math import assign_advantages, generate
from digenrl.train.transaction import GradientTransaction, TransactionError

from train_helpers import split_groups, train_group


def _step_batch(policy, P=2, G=4, T=6):
    prompts = DigitsTask().train_prompts(0, P, seed=0)
    rep = [p for p in prompts for _ in range(G)]
    gens = [g for _ in prompts for g in range(G)]
    plan = select_timesteps(T, fraction=0.5)
    batch = generate(policy, rep, gens, step=0, run_seed=1, version=0, settings=SamplerSettings(num_steps=T, noise_level=0.9), plan=plan)
    batch.rewards = torch.linspace(0, 1, len(batch)) ** 2
    assign_advantages(batch)
    return batch


def _reference_grad(policy, batch, clip=0.2):
    """Flow-GRPO style: for each trained timestep, mean loss over the whole batch, averaged over timesteps."""
    policy.zero_grad()
    S = batch.latents.shape[1]
    cond = policy.encode_prompts(batch.prompts)
    for j in range(S):
        i = int(batch.trained_steps[j])
        x = batch.latents[:, j]
        v = policy(x, batch.sigmas[i].expand(len(batch)), cond)
        out = sde_step_with_logprob(x, v, batch.sigmas[i], batch.sigmas[i + 1], noise_level=0.9, prev_sample=batch.next_latents[:, j])
        loss, _ = clipped_policy_loss(out.log_prob, batch.log_probs[:, j], batch.advantages, clip)
        (loss.mean() / S).backward()
    return [p.grad.clone() for p in policy.parameters()]


@pytest.mark.parametrize("shape", [(1, 1), (4, 3), (3, 2), (2, 1)])
def test_chunked_gradient_equals_per_timestep_reference(tiny_policy, shape):
    batch = _step_batch(tiny_policy)
    ref = _reference_grad(tiny_policy, batch)
    tiny_policy.zero_grad()
    S = batch.latents.shape[1]
    for group in split_groups(batch):
        train_group(tiny_policy, group, settings=LossSettings(noise_level=0.9), loss_scale=1 / (len(batch) * S),
                    chunk_generations=shape[0], chunk_timesteps=shape[1])
    for a, b in zip(ref, [p.grad for p in tiny_policy.parameters()]):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-7)


def test_tile_grid_tiles_grid_exactly_once():
    chunks = tile_grid([0, 1, 2, 3, 4], 3, 2, 2)
    cells = [c for ch in chunks for c in ch]
    assert sorted(cells) == sorted((g, t) for g in range(5) for t in range(3))
    assert chunks[0] == ((0, 0), (1, 0), (0, 1), (1, 1))  # timestep-major


def test_transaction_rules(tiny_policy):
    opt = torch.optim.SGD(tiny_policy.parameters(), lr=0.1)
    tx = GradientTransaction(tiny_policy.parameters(), opt)
    tx.begin(0, {("a", 0), ("a", 1)})
    tx.record([("a", 0)])
    with pytest.raises(TransactionError, match="twice"):
        tx.record([("a", 0)])
    with pytest.raises(TransactionError, match="not part"):
        tx.record([("b", 0)])
    before = [p.clone() for p in tiny_policy.parameters()]
    with pytest.raises(TransactionError, match="untrained"):
        tx.commit()
    assert all(torch.equal(a, b) for a, b in zip(before, tiny_policy.parameters()))
    tx.record([("a", 1)])
    tx.commit()
    assert tx.version == 1 and not tx.open
    with pytest.raises(TransactionError, match="outside"):
        tx.commit()


def test_training_before_advantages_is_refused(tiny_policy):
    batch = _step_batch(tiny_policy)
    batch.advantages = None
    with pytest.raises(ValueError, match="I3"):
        train_group(tiny_policy, split_groups(batch)[0], settings=LossSettings(), loss_scale=1.0, chunk_generations=2, chunk_timesteps=1)
