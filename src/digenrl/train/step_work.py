"""The three pieces of one step's work, shared by the reference loop and the disaggregated runtime:
generating trajectories, scoring + advantages of a complete group, and training a group's chunks."""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

from digenrl.algo.advantage import AdvantageStats, group_advantages
from digenrl.algo.timesteps import TimestepPlan
from digenrl.models.base import Policy
from digenrl.rewards.base import RewardOutputError, WeightedSum
from digenrl.rollout.records import Prompt, TrajectoryBatch
from digenrl.rollout.sampler import SamplerSettings, sample_trajectories
from digenrl.schedule.layout import grid_cells, tile_grid
from digenrl.train.chunk_loss import CellStats, LossSettings, train_cells


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
    max_batch: int = 64,
) -> TrajectoryBatch:
    """Generate (and, if ``reward`` is given, score) one trajectory per (prompt, generation) pair; a reward
    output that is not one finite score per sample raises ``RewardOutputError`` naming the step."""
    parts = []
    for i in range(0, len(prompts), max_batch):
        tb = sample_trajectories(
            policy, prompts[i : i + max_batch], gens[i : i + max_batch], step=step, run_seed=run_seed, version=version, settings=settings, plan=plan
        )
        if reward is not None:
            try:
                tb.rewards, tb.reward_parts = reward.score(tb.images, tb.prompts)
            except RewardOutputError as e:  # say where: the step (an eval runs as step -1)
                raise RewardOutputError(f"{f'step {step}' if step >= 0 else 'eval'}: {e}") from None
        parts.append(tb)
    return TrajectoryBatch.cat(parts)


def assign_advantages(batch: TrajectoryBatch, *, std_mode: str, adv_clip_max: float, global_std: float | None = None,
                      baseline: str = "group", unbiased: bool = False, eps: float = 1e-4,
                      global_mean: float | None = None, per_reward: bool = False,
                      clip_parts: bool = True) -> AdvantageStats:
    """Advantages for the complete groups in ``batch`` (grouped by prompt uid); ``per_reward``: one column per
    reward part (the loss weighs them with the reward weights), each clipped to +-``adv_clip_max``, or not
    (``clip_parts=False``: ``train.reward_aggregation=advantages`` clamps their weighted sum in the loss)."""
    if batch.rewards is None:
        raise ValueError("advantages need rewards")
    opts = dict(std_mode=std_mode, adv_clip_max=adv_clip_max, global_std=global_std, baseline=baseline,
                unbiased=unbiased, eps=eps, global_mean=global_mean)
    adv, stats = group_advantages(batch.rewards, batch.uids, **opts)
    if per_reward:  # DanceGRPO's vq / mq: one group-normalised advantage per reward part, [N, K]
        if not batch.reward_parts:
            raise ValueError("train.adv_per_reward needs the reward parts")
        opts.update(global_std=None, global_mean=None)
        if not clip_parts:
            opts["adv_clip_max"] = float("inf")
        adv = torch.stack([group_advantages(v, batch.uids, **opts)[0] for v in batch.reward_parts.values()], dim=1)
    batch.advantages = adv
    return stats


def advantage_options(train_cfg) -> dict:
    """The ``assign_advantages`` keyword arguments of a ``TrainConfig``."""
    t = train_cfg
    return {"std_mode": t.std_mode, "adv_clip_max": t.adv_clip_max, "baseline": t.adv_baseline,
            "unbiased": t.adv_std_unbiased, "eps": t.adv_eps, "per_reward": t.adv_per_reward,
            "clip_parts": t.reward_mix == "losses"}


def best_of_n_mask(rewards: Sequence[float], parts: Mapping[str, Sequence[float]] | None, n: int, *,
                   weights: Mapping[str, float] | None = None, unbiased: bool = False,
                   eps: float = 1e-4) -> torch.Tensor:
    """``train.best_of_n``: the mask [G] (generation order) of the n/2 lowest- and n/2 highest-scored generations
    of one group, DanceGRPO's ``--bestofn``.

    XueZeyue/DanceGRPO@15cc71d5 ``fastvideo/train_grpo_hunyuan.py`` (``train_one_step``): the advantages are
    computed over the whole group first (group mean, group std, not clipped yet), then::

        total_scores = vq_coef * vq_advantages + mq_coef * mq_advantages
        sorted_indices = torch.argsort(total_scores)
        selected = cat([sorted_indices[-bestofn // 2:], sorted_indices[:bestofn // 2]])
        samples[key] = samples[key][selected]          # the advantages are NOT recomputed on the subset

    and only the selected generations train, with their whole-group advantages (clipped in the loss). Here the
    score is the same: the group-statistics advantage (r - mean_G) / (std_G + eps), unclipped, of the reward, or
    (``weights`` given: ``train.adv_per_reward``) sum_k w_k A_k of the per-reward ones; ties go to the lower
    generation index (stable sort). It needs only the group's own rewards, so a pipelined mode selects a group
    as soon as it is scored; under ``std_mode=global`` / ``adv_baseline=batch`` a group's trained advantages
    are a positive multiple of r - c for one constant c, so they rank its generations exactly as this score."""
    from digenrl.algo.advantage import group_advantages

    G = len(rewards)
    if n % 2 or not 2 <= n <= G:
        raise ValueError(f"train.best_of_n must be even and in [2, {G}], got {n}")
    ids = torch.zeros(G, dtype=torch.long)

    def adv(values) -> torch.Tensor:
        v = torch.tensor([float(x) for x in values], dtype=torch.float64)
        return group_advantages(v, ids, std_mode="group", baseline="group", adv_clip_max=float("inf"),
                                unbiased=unbiased, eps=eps)[0]

    if weights is None:
        score = adv(rewards)
    else:
        missing = sorted(set(weights) - set(parts or {}))
        if missing:
            raise ValueError(f"train.best_of_n with train.adv_per_reward needs the reward parts {missing}")
        score = sum(w * adv(parts[k]) for k, w in weights.items())
    order = torch.argsort(score, stable=True).tolist()
    mask = torch.zeros(G, dtype=torch.bool)
    mask[order[: n // 2] + order[-(n // 2):]] = True
    return mask


def reward_weights(cfg) -> dict[str, float] | None:
    """reward name -> weight where ``train.adv_per_reward`` (the per-reward score of ``best_of_n_mask``), else None."""
    return {k: float(v.get("weight", 1.0)) for k, v in cfg.reward.items()} if cfg.train.adv_per_reward else None


def best_of_n(group: TrajectoryBatch, cfg) -> TrajectoryBatch:
    """The generations of a scored group that ``train.best_of_n`` trains (``best_of_n_mask``), as a group."""
    t = cfg.train
    parts = {k: v.tolist() for k, v in (group.reward_parts or {}).items()}
    mask = best_of_n_mask(group.rewards.tolist(), parts, t.best_of_n, weights=reward_weights(cfg),
                          unbiased=t.adv_std_unbiased, eps=t.adv_eps)
    return group.select(torch.nonzero(mask).flatten().tolist())


def kept_count(advantages: torch.Tensor, filter_zero_advantage: bool, keep: torch.Tensor | None = None) -> int:
    """Trajectories that count in a minibatch's mean: all, or (Flow-GRPO) those with a non-zero advantage, or
    those of the ``keep`` mask where one is given (``zero_adv_refill``: the non-zero ones and the re-added;
    the Ray trainers' ``sample_masks.round_masks``: the samples a round trains)."""
    if keep is not None:  # train.best_of_n may restrict it without the filter
        return int(keep.sum())
    nonzero = advantages != 0 if advantages.ndim == 1 else (advantages != 0).any(1)
    return int(nonzero.sum()) if filter_zero_advantage else len(advantages)


def zero_adv_refill(advantages: Sequence[torch.Tensor], *, micro_batches: int, run_seed: int,
                    step: int) -> list[torch.Tensor]:
    """``train.zero_adv_refill``: the kept mask of each of a step's groups (in group index order, rows in
    generation order) with Flow-GRPO's re-added zero-advantage samples.

    yifan123/flow_grpo@ac4c86e8 ``scripts/train_sd3.py``, after the advantages, on each process's samples::

        mask = (samples["advantages"].abs().sum(dim=1) != 0)
        if true_count % num_batches != 0:                    # num_batches = sample.num_batches_per_epoch
            false_indices = torch.where(~mask)[0]
            num_to_change = num_batches - (true_count % num_batches)
            if len(false_indices) >= num_to_change:
                mask[false_indices[torch.randperm(len(false_indices))[:num_to_change]]] = True

    so that its kept samples reshape into ``num_batches_per_epoch`` equal micro-batches; the re-added samples
    train with A = 0 (no policy gradient, their KL does count) and count in the mean. Here the same rule on the
    whole step: R = P G / ``train.micro_batch`` (the step's micro-batches), the zero-advantage samples listed
    group by group in generation order, and the permutation drawn from a generator seeded with
    ``stable_seed(run_seed, step, "zero_adv_refill")`` (Flow-GRPO: each process rounds its own share with its
    global torch RNG, so up to GPUs x (R - 1) samples there, up to R - 1 here; ``train_wan2_1.py`` has the same
    rule with R = ``num_batches_per_epoch x sample_time_per_prompt``). Every mode that runs it
    (those with a barrier: all the step's advantages before the first training cell) gets the same masks.
    It is arguably a bug (random samples of no advantage dilute the mean and add KL), hence off by default."""
    from digenrl.algo.timesteps import stable_seed

    keep = [(a != 0 if a.ndim == 1 else (a != 0).any(1)).clone() for a in advantages]
    short = -sum(int(k.sum()) for k in keep) % micro_batches
    zeros = [(i, j) for i, k in enumerate(keep) for j in torch.nonzero(~k).flatten().tolist()]
    if short and len(zeros) >= short:
        gen = torch.Generator().manual_seed(stable_seed(run_seed, step, "zero_adv_refill"))
        for r in torch.randperm(len(zeros), generator=gen)[:short].tolist():
            keep[zeros[r][0]][zeros[r][1]] = True
    return keep


def sample_minibatches(groups: Sequence[TrajectoryBatch], minibatches: int, *, run_seed: int, step: int, epoch: int,
                       filter_zero_advantage: bool) -> list[list[TrajectoryBatch]]:
    """``train.minibatch_split=samples``: the M minibatches of one inner epoch, each a list of (parts of) groups.

    Flow-GRPO (yifan123/flow_grpo@ac4c86e8 ``scripts/train_sd3.py``), per inner epoch, after the filter::

        perm = torch.randperm(total_batch_size); samples = samples[perm]
        samples_batched = samples.reshape(num_batches_per_epoch, -1, ...)   # k consecutive = one optimizer step

    Here: the step's kept samples (``kept_count``'s: all, the non-zero ones, or the ``keep`` mask), listed group
    by group in row order, permuted with ``stable_seed(run_seed, step, epoch, "minibatch_split")`` and cut into
    M contiguous parts of sizes differing by at most one (``torch.tensor_split``; Flow-GRPO's are equal since its
    refill makes the count divide; it permutes each GPU's share, here the whole step's). Part m, grouped back by
    prompt group (groups in order, rows in order), is minibatch m; a sample that does not count is in none (it
    would add nothing). Every group is then in every minibatch, so a minibatch needs the whole step: the barrier
    modes only (``config``: ``train.minibatch_split``; the Ray trainers' masks: ``sample_masks.minibatch_masks``)."""
    from digenrl.algo.timesteps import stable_seed

    flat = []
    for i, g in enumerate(groups):
        a = g.advantages
        if not filter_zero_advantage:
            kept = torch.ones(len(g), dtype=torch.bool)
        elif g.keep is not None:
            kept = g.keep
        else:
            kept = a != 0 if a.ndim == 1 else (a != 0).any(1)
        flat += [(i, r) for r in torch.nonzero(kept).flatten().tolist()]
    gen = torch.Generator().manual_seed(stable_seed(run_seed, step, epoch, "minibatch_split"))
    perm = torch.randperm(len(flat), generator=gen)
    out = []
    for part in torch.tensor_split(perm, minibatches):
        rows: dict[int, list[int]] = {}
        for k in part.tolist():
            rows.setdefault(flat[k][0], []).append(flat[k][1])
        out.append([groups[i].select(sorted(rows[i])) for i in sorted(rows)])
    return out


def train_group(
    policy: Policy,
    group: TrajectoryBatch,
    *,
    settings: LossSettings,
    loss_scale: float,
    chunk_generations: int,
    chunk_timesteps: int,
    ref_policy: Policy | None = None,
    record=None,
) -> CellStats:
    """Train every cell of one prompt group, chunk by chunk. ``record(cells)`` marks them in the transaction."""
    uid = group.prompts[0].uid
    gens = group.gen_index.tolist()
    total = CellStats()
    for chunk in tile_grid(gens, len(group.trained_steps), chunk_generations, chunk_timesteps):
        if record is not None:
            record([(uid, g, t) for g, t in chunk])
        total = total.add(train_cells(policy, group, chunk, settings=settings, loss_scale=loss_scale, ref_policy=ref_policy))
    return total


def split_groups(batch: TrajectoryBatch) -> list[TrajectoryBatch]:
    """The prompt groups of a batch, in order of first appearance."""
    uids = batch.uids.tolist()
    order = list(dict.fromkeys(uids))
    return [batch.select([i for i, u in enumerate(uids) if u == g]) for g in order]


def expected_cells(prompts: Sequence[Prompt], num_generations: int, num_trained: int) -> set[tuple[int, int, int]]:
    """The step's cells keyed by prompt uid, as the gradient transaction records them."""
    return grid_cells([p.uid for p in prompts], num_generations, num_trained)


def reward_stats(batch: TrajectoryBatch) -> dict[str, float]:
    r = batch.rewards if batch.rewards is not None else torch.zeros(len(batch))
    out = {"reward_mean": float(r.mean()), "reward_std": float(r.std(unbiased=False))}
    for k, v in (batch.reward_parts or {}).items():
        out[f"reward/{k}"] = float(v.mean())
    return out
