"""Events (executor -> scheduler) and actions (scheduler -> executor).

Every event carries ``time``: the executor's clock when the work ended (virtual seconds in ``sim``, wall
seconds in ``runtime``). The scheduler never reads a clock; an action returned by ``start(t)`` or
``on_event(e)`` is assumed to start at ``t`` / ``e.time`` (BTS predicts with that assumption).

Versions: the initial weights are version 0; committing step k produces version k + 1.

Steps are 0-based here (the scheduler, the workers, the trajectories' noise), 1-based wherever a person reads
them: ``step_number`` is the one conversion (labels, the progress line, ``metrics.jsonl``, messages,
``failure.json``).

Every action describes itself: ``kind`` (one constant per class, the names of ``KINDS``: the ``Durations``
method that prices it, the simulator's jitter kinds, the online cost model's kinds), ``step``, ``workers``
(the scheduler's workers it occupies, decided here once: the scheduler reserves them, the executors record
their busy intervals and the audit checks them), ``size()`` (a ``Size``, what its spans carry), ``label()``
(for people: span labels and failure messages) and ``event(t)`` (the event that reports it finished at t).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Union

from .layout import Chunk, Fragment


def step_number(step: int) -> int:
    """The number a person reads for the scheduler's ``step``: ``step + 1``. Step n produces version n, so "after
    step n" is n committed steps (a checkpoint of n steps; ``--resume`` from it goes on with step n + 1)."""
    return step + 1

# ---- events ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FragmentGenerated:
    """A fragment is sampled, decoded and rewarded (its rewards are in) on ``worker`` (a gang over several
    groups: ``fragment`` is its first part, ``Generate.fragment``, and every part is in)."""

    time: float
    fragment: Fragment
    worker: str


@dataclass(frozen=True)
class ChunkTrained:
    """A chunk's forward+backward is done; its gradient is in the step's uncommitted transaction."""

    time: float
    chunk: Chunk
    rank: str


@dataclass(frozen=True)
class Committed:
    """The optimizer step of round ``round`` of ``step`` is done on every trainer rank (after the step's last
    round the weights are version step + 1)."""

    time: float
    step: int
    round: int = 0


@dataclass(frozen=True)
class Published:
    """Version ``version`` has reached every generator (it may be swapped in between fragments)."""

    time: float
    version: int


Event = Union[FragmentGenerated, ChunkTrained, Committed, Published]

# ---- actions --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Size:
    """How much work an action is: ``generations`` sampled (a Generate), ``cells`` trained (a Train); 0 and 0
    for a collective."""

    generations: int = 0
    cells: int = 0

    @property
    def units(self) -> int:
        """What its time scales with: generations of a fragment, cells of a chunk, 1 for a collective."""
        return self.generations or self.cells or 1


class _Described:
    """What every action says of itself (see the module docstring)."""

    kind: ClassVar[str]
    collective: ClassVar[bool] = False   # every trainer rank takes part (a Commit, a Publish)

    @property
    def span_kind(self) -> str:
        """The kind of its spans: ``kind``, but "tag" for trainer-assisted generation."""
        return self.kind

    def size(self) -> Size:
        return Size()


@dataclass(frozen=True)
class Generate(_Described):
    """Sample ``fragment`` on ``worker`` with policy ``version``, decode, score.

    ``tag``: the worker is a trainer rank doing trainer-assisted generation (it must not touch its
    uncommitted gradients or the optimizer). ``switch``: the worker is a trainer rank whose previous action
    was not a Generate, so it first builds its inference copy (e.g. gathers FSDP shards); colocated workers
    set it on their first fragment of a step. ``stale``: version = step - 1 (TCSS); the trajectories must
    keep their behaviour log-probs for the PPO ratio.

    ``more``: a gang TAG action on a shard group that spans several prompt groups (``layout.gang_parts``):
    ``fragment`` is its part of the first group, ``more`` the parts of the following groups, in dispatch order.
    The ranks split the union of the parts round-robin and each samples its share in one batch; one
    ``FragmentGenerated`` (naming ``fragment``) reports every part.
    """

    kind: ClassVar[str] = "generate"
    fragment: Fragment
    worker: str
    version: int
    tag: bool = False
    switch: bool = False
    more: tuple[Fragment, ...] = ()

    @property
    def step(self) -> int:
        return self.fragment.step

    @property
    def workers(self) -> tuple[str, ...]:
        return (self.worker,)

    @property
    def span_kind(self) -> str:
        return "tag" if self.tag else "generate"

    @property
    def stale(self) -> bool:
        return self.version < self.fragment.step

    @property
    def fragments(self) -> tuple[Fragment, ...]:
        """Every part of the action (one fragment unless a gang spans several groups)."""
        return (self.fragment,) + self.more

    def size(self) -> Size:
        n = len(self.fragment.generations)  # over its parts (``fragments``)
        for f in self.more:
            n += len(f.generations)
        return Size(generations=n)

    def label(self) -> str:
        fr = self.fragment
        groups = f"{fr.group}-{self.more[-1].group}" if self.more else f"{fr.group}"  # a gang over groups
        stale = " stale" if self.stale else ""
        return f"s{step_number(fr.step)} g{groups} x{self.size().generations} v{self.version}{stale}"

    def event(self, t: float) -> FragmentGenerated:
        return FragmentGenerated(t, self.fragment, self.worker)


@dataclass(frozen=True)
class Train(_Described):
    """Forward+backward of ``chunk`` on trainer ``rank``, accumulated without gradient sync (``no_sync``)."""

    kind: ClassVar[str] = "train"
    chunk: Chunk
    rank: str

    @property
    def step(self) -> int:
        return self.chunk.step

    @property
    def workers(self) -> tuple[str, ...]:
        return (self.rank,)

    def size(self) -> Size:
        return Size(cells=self.chunk.size)

    def label(self) -> str:
        return f"s{step_number(self.chunk.step)} g{self.chunk.group} {self.chunk.size} cells"

    def event(self, t: float) -> ChunkTrained:
        return ChunkTrained(t, self.chunk, self.rank)


@dataclass(frozen=True)
class Commit(_Described):
    """Gradient all-reduce + optimizer step of round ``round`` of ``step`` on all ``ranks`` (a collective).

    ``final``: the step's last round (its commit makes version step + 1; earlier rounds change the weights
    but not the version)."""

    kind: ClassVar[str] = "commit"
    collective: ClassVar[bool] = True
    step: int
    ranks: tuple[str, ...]
    round: int = 0
    final: bool = True

    @property
    def workers(self) -> tuple[str, ...]:
        return self.ranks

    def label(self) -> str:
        return f"commit s{step_number(self.step)}"

    def event(self, t: float) -> Committed:
        return Committed(t, self.step, self.round)


@dataclass(frozen=True)
class Publish(_Described):
    """Send the weights of ``version`` from ``ranks`` to ``generators`` (empty in colocated mode).

    ``joined`` (``plan.publish_joins``): the generators take part, so it occupies them too; ``streamed``
    (``plan.publish_streams``): the ranks only start their sends (charged to the final commit) and go on with
    their work, so it occupies the generators alone. ``workers`` = (ranks unless streamed) + (generators if
    joined): the one rule of who is held by a publish.
    """

    kind: ClassVar[str] = "publish"
    collective: ClassVar[bool] = True
    version: int
    ranks: tuple[str, ...]
    generators: tuple[str, ...]
    joined: bool = False
    streamed: bool = False

    @property
    def step(self) -> int:
        """The step whose commit made ``version``."""
        return self.version - 1

    @property
    def workers(self) -> tuple[str, ...]:
        return (() if self.streamed else self.ranks) + (self.generators if self.joined else ())

    def label(self) -> str:
        return f"publish v{self.version}"

    def event(self, t: float) -> Published:
        return Published(t, self.version)


Action = Union[Generate, Train, Commit, Publish]
KINDS: tuple[str, ...] = tuple(a.kind for a in (Generate, Train, Commit, Publish))
