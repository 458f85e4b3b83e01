"""Which samples of its groups a round trains, as masks: ``train.best_of_n``, ``train.zero_adv_refill`` and
``train.minibatch_split=samples`` / ``generations``, the one home of these rules.

The trainer ranks keep every group whole (a chunk's cells are (generation, trained position) of the full G x S
grid, the scheduler plans those) and get, per round, a mask [G] per group in generation order: the samples the
round trains and counts. A rank drops the chunk cells outside it before
the forward (``masked_cells``), and the commit divides by the masks' sum (``step_math.kept_count``), so the
round's gradient is the loop's::

    grad_m = (1 / |K_m|) sum_{i in K_m} sum_{t} grad (1 / S) L(i, t),    K_m = the round's mask

* ``best_of_n``: K = the group's best-of-n selection (``best_of_n_mask``, group-local), intersected
  with A != 0 under ``train.filter_zero_advantage``;
* ``zero_adv_refill``: Flow-GRPO's re-added zero-advantage samples, drawn among the selected samples;
* ``minibatch_split=samples``: round r = (epoch r // M, minibatch r mod M) trains part r mod M of the seeded
  permutation of the step's kept samples (every group is in every round: ``StepPlan.sample_split``);
* ``minibatch_split=generations``: round r trains the block r mod M of every group's generations, generation j
  in block floor(j M / G) (MixGRPO's optimizer step: 3 of each prompt's 12), intersected with the kept samples;
  group-local, so a pipelined mode trains a group's block as soon as the group is rewarded.

The I1 reference (``tests/reference``) selects rows instead, written from the same peers' formulas.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

from digenrl.algo.advantage import group_advantages
from digenrl.algo.timesteps import stable_seed
from digenrl.schedule.plan import minibatch_of
from digenrl.schedule import step_number
from digenrl.train.step_math import kept_cells, nonzero

Rewards = Mapping[int, Sequence[float]]
Parts = Mapping[int, Mapping[str, Sequence[float]]]


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
    keep = [nonzero(a).clone() for a in advantages]
    short = -sum(int(k.sum()) for k in keep) % micro_batches
    zeros = [(i, j) for i, k in enumerate(keep) for j in torch.nonzero(~k).flatten().tolist()]
    if short and len(zeros) >= short:
        gen = torch.Generator().manual_seed(stable_seed(run_seed, step, "zero_adv_refill"))
        for r in torch.randperm(len(zeros), generator=gen)[:short].tolist():
            keep[zeros[r][0]][zeros[r][1]] = True
    return keep


def _selected(cfg, rewards: Rewards, parts: Parts | None, groups) -> dict[int, torch.Tensor]:
    """group -> its best-of-n selection (``train.best_of_n``), or every sample."""
    t = cfg.train
    return {g: (torch.ones(len(rewards[g]), dtype=torch.bool) if t.best_of_n is None else
                best_of_n_mask(rewards[g], (parts or {}).get(g), t.best_of_n, weights=reward_weights(cfg),
                               unbiased=t.adv_std_unbiased, eps=t.adv_eps)) for g in groups}


def kept_masks(cfg, adv: Mapping[int, torch.Tensor], rewards: Rewards, parts: Parts | None, *,
               step: int) -> dict[int, torch.Tensor]:
    """group -> the samples that train and count (generation order) for the groups of ``adv`` (final advantages):
    the best-of-n selection (or all), then A != 0 under the filter, or Flow-GRPO's refill on the selected ones."""
    t = cfg.train
    groups = sorted(adv)
    sel = _selected(cfg, rewards, parts, groups)
    if t.zero_adv_refill:  # the loop's zero_adv_refill on its (selected) groups, in group order
        sub = zero_adv_refill([adv[g][sel[g]] for g in groups], run_seed=cfg.seed, step=step,
                              micro_batches=t.prompts_per_step * t.generations // t.micro_batch)
        out = {g: torch.zeros(len(adv[g]), dtype=torch.bool) for g in groups}
        for g, k in zip(groups, sub):
            out[g][sel[g]] = k
        return out
    if not t.filter_zero_advantage:
        return sel
    return {g: sel[g] & nonzero(adv[g]) for g in groups}


def minibatch_masks(kept: Mapping[int, torch.Tensor], minibatches: int, *, run_seed: int, step: int,
                    epoch: int) -> list[dict[int, torch.Tensor]]:
    """``minibatch_split=samples``: per minibatch m, group -> its samples in part m of the permutation.

    The kept samples (i, j) listed group by group (ascending), generation j ascending; perm = randperm of their
    count under ``stable_seed(run_seed, step, epoch, "minibatch_split")``; part m = ``tensor_split(perm, M)[m]``
    (Flow-GRPO ``train_sd3.py``: ``samples[perm].reshape(num_batches_per_epoch, ...)``)."""
    flat = [(g, j) for g in sorted(kept) for j in torch.nonzero(kept[g]).flatten().tolist()]
    gen = torch.Generator().manual_seed(stable_seed(run_seed, step, epoch, "minibatch_split"))
    perm = torch.randperm(len(flat), generator=gen)
    out = []
    for part in torch.tensor_split(perm, minibatches):
        masks = {g: torch.zeros_like(kept[g]) for g in kept}
        for k in part.tolist():
            masks[flat[k][0]][flat[k][1]] = True
        out.append(masks)
    return out


def generation_block(generations: int, minibatches: int, m: int) -> torch.Tensor:
    """``minibatch_split=generations``: the mask [G] of the generations j of block ``m``, floor(j M / G) = m (the
    membership rule of ``schedule.plan.minibatch_of``, applied to a group's generations)."""
    return torch.tensor([minibatch_of(j, generations, minibatches) == m for j in range(generations)], dtype=torch.bool)


def round_masks(cfg, plan, rewards: Rewards, parts: Parts | None, *, step: int,
                round: int) -> dict[int, torch.Tensor] | None:
    """group -> the samples round ``round`` of ``step`` trains and counts, for the groups in ``rewards``; None
    where no option restricts them (every sample, the zero-advantage filter left to the loss).

    Before every reward of a step-wide step is in (a pipelined round trained provisionally,
    ``loss_scale.DeferredRound``) only the best-of-n selection is known; the filter then comes with the commit,
    which calls this again with every reward. ``zero_adv_refill`` and ``minibatch_split=samples`` need the
    whole step (the config allows them in the barrier modes only)."""
    from digenrl.train.loss_scale import step_advantages

    t = cfg.train
    samples, blocks = t.minibatch_split == "samples", t.minibatch_split == "generations"
    if t.best_of_n is None and not t.zero_adv_refill and not samples and not blocks:
        return None
    M, partial = plan.minibatches, len(rewards) < plan.prompts
    if partial and (t.zero_adv_refill or samples):
        raise RuntimeError(f"train.zero_adv_refill / minibatch_split=samples at step {step_number(step)} need the "
                           f"rewards of all {plan.prompts} groups, got {sorted(rewards)}")
    if partial and t.step_wide:
        kept = _selected(cfg, rewards, parts, rewards)
    else:
        kept = kept_masks(cfg, step_advantages(rewards, t, parts), rewards, parts, step=step)
    if samples:
        kept = minibatch_masks(kept, M, run_seed=cfg.seed, step=step, epoch=round // M)[round % M]
    if blocks:
        kept = {g: k & generation_block(len(k), M, round % M) for g, k in kept.items()}
    return kept


def masked_cells(cells: Sequence[tuple[int, int]], weight: float, mask: torch.Tensor, *, collective: bool,
                 chunk: Sequence[tuple[int, int]] = ()) -> tuple[list, float]:
    """The (generation, position) ``cells`` of a rank's share whose generation is in ``mask``, and their weight;
    none left: [] (nothing to run), or on a sharded pool (``collective``) the first cell with weight 0 so that
    the rank still joins the chunk's all-gathers (as ``sharding.rank_cells`` does) — unless no cell of the
    whole ``chunk`` is in the mask: every rank of the shard group has the same mask, so all of them skip it
    and no collective is left waiting."""
    return kept_cells(cells, [bool(mask[g]) for g, _ in cells], collective and any(bool(mask[g]) for g, _ in chunk),
                      weight)

