"""Small results the workers return to the driver (metadata only: tensors stay in the object store).

Every result names its ``worker`` and carries ``start`` / ``end``: the worker's own ``time.monotonic()`` read
around the work itself. The driver maps them onto its monotonic clock by the offset it measured for that worker
at startup (``clocks.measure_offsets``) and turns them into run-relative span times; scheduler events use the
driver's clock (when it saw the result).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from digenrl.schedule import Chunk, Fragment
from digenrl.train.chunk_loss import CellStats


@dataclass(frozen=True)
class FragmentInfo:
    """A generated and rewarded fragment. The trajectories themselves are the call's other return value."""

    fragment: Fragment
    worker: str
    version: int                       # the one policy version that produced every trajectory of it
    uid: int                           # prompt uid of the group
    rewards: tuple[float, ...]         # per generation, in ``fragment.generations`` order
    reward_parts: dict[str, tuple[float, ...]] = field(default_factory=dict)
    start: float = 0.0
    end: float = 0.0


@dataclass(frozen=True)
class ChunkResult:
    chunk: Chunk
    worker: str                        # the trainer rank
    cells: tuple[tuple[int, int, int], ...]  # (uid, generation, trained position) recorded in the transaction
    stats: CellStats                   # a round trained before its step's rewards: cells only (see CommitResult)
    start: float = 0.0
    end: float = 0.0


@dataclass(frozen=True)
class CommitResult:
    step: int
    worker: str                        # the trainer rank
    version: int                       # weights version after the commit (= step + 1)
    grad_norm: float
    start: float = 0.0
    end: float = 0.0
    stats: CellStats | None = None     # the loss statistics of a deferred round's cells (``train.loss_scale``)
    kept: int = 0                      # the round's trajectories that count in its mean (``LossScale.kept``)


@dataclass(frozen=True)
class TimedResult:
    """Any other timed call (publish, weight receipt, eval, checkpoint)."""

    worker: str
    what: str
    start: float
    end: float
    value: object = None
