"""A step's work on the workers: generating (and scoring) trajectories, the advantages of complete groups, which
trajectories count in a round's mean (``kept_count``; which of them a round trains: ``train.sample_masks``) and
which cells a rank runs when a filter or mask leaves none (``kept_cells``)."""

from __future__ import annotations

from typing import Sequence

import torch

from digenrl.algo.advantage import AdvantageStats, group_advantages
from digenrl.algo.deferred_std import AdvOptions
from digenrl.algo.timesteps import TimestepPlan
from digenrl.models.base import Policy
from digenrl.rewards.base import RewardOutputError, WeightedSum
from digenrl.rollout.records import Prompt, TrajectoryBatch
from digenrl.train.memory_check import SAMPLE_BATCH
from digenrl.rollout.sampler import SamplerSettings, sample_trajectories
from digenrl.schedule import step_number


def generate(
    policy: Policy,
    prompts: Sequence[Prompt],
    gens: Sequence[int],
    *,
    step: int,
    run_seed: int,
    version: int,
    settings: SamplerSettings,
    plan: TimestepPlan,
    reward: WeightedSum | None = None,
    max_batch: int = SAMPLE_BATCH,
    decode: bool = True,
) -> TrajectoryBatch:
    """Generate (and, if ``reward`` is given, score) one trajectory per (prompt, generation) pair; a reward
    output that is not one finite score per sample raises ``RewardOutputError`` naming the step. The pairs are
    sampled in batches of at most ``max_batch`` (a trainer rank's memory bound:
    ``train.memory_check.trainer_generation_batch``). ``decode=False`` (no reward): the latents only (a
    sequence-parallel follower runs its lead's forwards, batch for batch)."""
    parts = []
    for i in range(0, len(prompts), max_batch):
        tb = sample_trajectories(
            policy, prompts[i : i + max_batch], gens[i : i + max_batch], step=step, run_seed=run_seed, version=version, settings=settings, plan=plan,
            decode=decode,
        )
        if reward is not None:
            try:
                tb.rewards, tb.reward_parts = reward.score(tb.images, tb.prompts)
            except RewardOutputError as e:  # say where: the step (an eval runs as step -1)
                raise RewardOutputError(f"{f'step {step_number(step)}' if step >= 0 else 'eval'}: {e}") from None
        parts.append(tb)
    return TrajectoryBatch.cat(parts)


def assign_advantages(batch: TrajectoryBatch, opts: AdvOptions = AdvOptions()) -> AdvantageStats:
    """Advantages for the complete groups in ``batch`` (grouped by prompt uid); ``opts.per_reward``: one column per
    reward part (the loss weighs them with the reward weights), each clipped to +-``opts.clip``, or not
    (``clip_parts=False``: ``train.reward_aggregation=advantages`` clamps their weighted sum in the loss)."""
    if batch.rewards is None:
        raise ValueError("advantages need rewards")
    kw = dict(std_mode=opts.std_mode, baseline=opts.baseline, unbiased=opts.unbiased, eps=opts.eps)
    adv, stats = group_advantages(batch.rewards, batch.uids, adv_clip_max=opts.clip, **kw)
    if opts.per_reward:  # DanceGRPO's vq / mq: one group-normalised advantage per reward part, [N, K]
        if not batch.reward_parts:
            raise ValueError("train.adv_per_reward needs the reward parts")
        clip = opts.clip if opts.clip_parts else float("inf")
        adv = torch.stack([group_advantages(v, batch.uids, adv_clip_max=clip, **kw)[0]
                           for v in batch.reward_parts.values()], dim=1)
    batch.advantages = adv
    return stats


def adv_options(train_cfg) -> AdvOptions:
    """The advantage options of a ``TrainConfig``: the one place that reads its keys."""
    t = train_cfg
    return AdvOptions(t.std_mode, t.adv_baseline, t.adv_eps, t.adv_clip_max, t.adv_std_unbiased,
                      t.filter_zero_advantage, t.adv_per_reward, t.reward_mix == "losses")


def nonzero(advantages: torch.Tensor) -> torch.Tensor:
    """The samples whose advantage is not 0 (a [N, K] per-reward advantage: any of its columns)."""
    return advantages != 0 if advantages.ndim == 1 else (advantages != 0).any(1)


def kept_count(advantages: torch.Tensor, filter_zero_advantage: bool, keep: torch.Tensor | None = None) -> int:
    """Trajectories that count in a minibatch's mean: all, or (Flow-GRPO) those with a non-zero advantage, or
    those of the ``keep`` mask where one is given (``sample_masks``: the samples a round trains, e.g. with
    ``train.zero_adv_refill`` the non-zero ones and the re-added)."""
    if keep is not None:  # train.best_of_n may restrict it without the filter
        return int(keep.sum())
    return int(nonzero(advantages).sum()) if filter_zero_advantage else len(advantages)


def kept_cells(cells: Sequence[tuple[int, int]], keep: Sequence[bool], collective: bool,
               weight: float = 1.0) -> tuple[list, float]:
    """The ``cells`` where ``keep``, with ``weight``; none: [] (nothing to run), or on a sharded pool
    (``collective``: its forward and backward all-gather the blocks with the shard group's other ranks) the first
    cell with weight 0, which joins every collective of the chunk and adds exactly 0 instead of leaving the others
    waiting in the all-gather until ``runtime.collective_timeout_s`` (``chunk_loss``, ``loss_scale``,
    ``sample_masks.masked_cells``)."""
    mine = [c for c, k in zip(cells, keep, strict=True) if k]
    return (list(cells[:1]), 0.0) if collective and not mine else (mine, weight)
