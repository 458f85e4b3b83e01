"""The sequence-parallel trainer (``train.sequence_parallel`` = d > 1; why a lane computes what one unsplit rank
does, and how the runtime lays lanes out over shard groups: docs/sequence_parallel.md).

d consecutive trainer ranks form a *lane* (never straddling two shard groups): they train the same cells at once,
each holding 1 / d of every sample's latent tokens (``models.sequence_parallel``), and their parameter gradients
sum to the unsplit one (the loss scale is unchanged). The lane's first rank (its *lead*) reports the lane's
statistics and sampled trajectories; the others (*followers*) run the same forwards and report nothing
(``lane_role``).
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
