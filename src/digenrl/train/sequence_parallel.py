"""The sequence-parallel trainer (``train.sequence_parallel`` = d > 1, docs/sequence_parallel.md).

d consecutive trainer ranks form a *lane*: they train the same cells at once, each holding 1 / d of every
sample's latent tokens (``models.sequence_parallel``). What a lane computes equals one unsplit rank's:

* the loss of every cell is computed on every rank from the gathered velocity (the same number), and each rank's
  backward carries only its own tokens' part, so the d ranks' parameter gradients **sum** to the unsplit one:
  the commit's all-reduce (SUM over all trainer ranks) or FSDP's per-chunk reduce-scatter (over a shard group
  that contains the lane) adds them; the loss scale of ``train.loss_scale`` is unchanged;
* the lane's statistics and sampled trajectories are reported once, by its first rank (its *lead*); the others
  (*followers*) run the same forwards and report nothing (``lane_role``).

Layout (the trainer ranks in order): shard groups of g ranks (``train.shard_groups``; g = all ranks without
hybrid sharding, or every rank alone without FSDP), each cut into g / d lanes of d consecutive ranks; a lane
never straddles two shard groups. The scheduler sees one trainer per shard group (FSDP) or per lane (``sp<i>``)
and splits a chunk's cells or a gang's fragments over the lanes (``StepPlan.shard_ranks`` lanes).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LaneRole:
    """Where a trainer rank stands: ``lane`` of ``lanes`` in its scheduler trainer, ``index`` in its lane of
    ``degree`` ranks (0: the lead, which reports the lane's results)."""

    lane: int = 0
    lanes: int = 1
    index: int = 0
    degree: int = 1

    @property
    def lead(self) -> bool:
        return self.index == 0


def lane_role(local: int, group_size: int, degree: int) -> LaneRole:
    """The role of the rank ``local`` of a scheduler trainer of ``group_size`` ranks cut into lanes of ``degree``."""
    return LaneRole(local // degree, group_size // degree, local % degree, degree)


def sequence_context(ctx, group):
    """Split the sequence of ``ctx.policy`` (and of a sharded KL reference's own frozen root) over ``group``; the
    policy's ``sequence_group`` is the result. Call after ``train.sharding.shard_context`` (FSDP wraps the blocks
    first; the split hooks then wrap their forwards)."""
    from digenrl.models.sequence_parallel import enable_sequence_parallel, split_transformer

    sg = enable_sequence_parallel(ctx.policy, group)
    root = getattr(ctx.ref_policy, "root", None)
    if root is not None:
        split_transformer(ctx.policy.spec.name, root, sg)
    return sg
