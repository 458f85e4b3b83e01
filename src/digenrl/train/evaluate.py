"""Evaluation: ODE sampling (noise_level 0, guidance ``eval_cfg_scale``) of a fixed prompt set with fixed seeds; mean reward."""

from __future__ import annotations

from dataclasses import replace

import torch

from digenrl.algo.timesteps import TimestepPlan
from digenrl.models.base import Policy
from digenrl.rewards.base import WeightedSum
from digenrl.rollout.records import TrajectoryBatch
from digenrl.rollout.sampler import SamplerSettings
from digenrl.train.memory_check import SAMPLE_BATCH
from digenrl.train.step_math import generate

EVAL_SEED_OFFSET = 1_000_003  # eval noise is independent of any training step's noise


@torch.no_grad()
def evaluate(policy: Policy, prompts, reward: WeightedSum, settings: SamplerSettings, *, run_seed: int, num_steps: int | None = None,
             max_batch: int = SAMPLE_BATCH) -> tuple[float, TrajectoryBatch]:
    """(mean reward, the samples): ``prompts`` sampled in batches of at most ``max_batch`` (a trainer rank's
    memory bound, ``train.memory_check.trainer_generation_batch``)."""
    cfg = settings.cfg_scale if settings.eval_cfg_scale is None else settings.eval_cfg_scale
    ode = replace(settings, noise_level=0.0, num_steps=num_steps or settings.num_steps, cfg_scale=cfg, same_latent=False,
                  ode_solver="euler")  # (DiffusionNFT's eval_fn: solver="flow", the Euler ODE, whatever it samples with)
    was_training = policy.training
    policy.eval()
    batch = generate(
        policy, prompts, [0] * len(prompts), step=-1, run_seed=run_seed + EVAL_SEED_OFFSET, version=-1,
        settings=ode, plan=TimestepPlan((), ()), reward=reward, max_batch=max_batch,
    )
    policy.train(was_training)
    return float(batch.rewards.mean()), batch
