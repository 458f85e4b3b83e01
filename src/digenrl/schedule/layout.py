"""Work identifiers and how a step's work is cut into them.

A **Fragment** is (step, group, generation indices): rollout work on one prompt group. A **Chunk** is
(step, group, cells) with cells = (generation, trained-timestep index) pairs: training work, one packed
forward+backward. Both are plain frozen dataclasses (hashable, picklable), so a runtime can ship them.

Tilings (each cell of the G x S grid of a group appears in exactly one chunk, so the per-step loss, with each
cell scaled by 1 / (B * S) by the trainer, is the same whatever the tiling):

* classic layout (non-TSP modes): one chunk = "one trained timestep x the rank's data-parallel shard of the
  group's generations", one chunk per timestep. The shard follows the unit of work that is available at once:
  with a full-batch barrier (``naive``, ``colocated``) the step's B trajectories b = group * G + generation
  are split into N_t contiguous shards (b -> rank floor(b * N_t / B), a sequential distributed sampler), so a
  rank's chunks are as large as its local batch allows; in ``gap`` groups arrive one by one, so each group is
  sharded over all ranks (b -> rank b mod N_t). A rank without a generation in the group has no chunk for it
  (it idles while that group trains: this is what TSP removes).
* TSP layout: ``tile_grid`` by ``chunk_generations x chunk_timesteps``; the chunks go to any free trainer rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, lru_cache
from itertools import groupby
from typing import Callable, Container, Hashable, Sequence

from .plan import StepPlan


@dataclass(frozen=True, order=True)
class Fragment:
    step: int
    group: int
    generations: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.generations)


@dataclass(frozen=True, order=True)
class Chunk:
    step: int
    group: int
    cells: tuple[tuple[int, int], ...]  # (generation index, trained-timestep index)
    round: int = 0                      # the step's training round (minibatch x epoch) it belongs to

    @property
    def size(self) -> int:
        return len(self.cells)


def group_fragments(plan: StepPlan, step: int, group: int) -> list[Fragment]:
    """Consecutive blocks of ``fragment_size`` generations of one group, in generation order."""
    g, f = plan.generations, plan.fragment_size
    return [Fragment(step, group, tuple(range(lo, min(lo + f, g)))) for lo in range(0, g, f)]


def step_fragments(plan: StepPlan, step: int) -> list[Fragment]:
    """The dispatch order of a step: group by group (GAP: replicas cooperate on the earliest groups)."""
    return [fr for grp in range(plan.prompts) for fr in group_fragments(plan, step, grp)]


Cell = tuple[int, int]  # (generation index, trained-timestep position)


def tile_grid(gens: Sequence[int], num_trained: int, chunk_generations: int,
              chunk_timesteps: int) -> list[tuple[Cell, ...]]:
    """The one tiling of a group's (generation x trained timestep) grid into chunks, timestep-major: for each
    block of ``chunk_timesteps`` timesteps, for each block of ``chunk_generations`` of ``gens``, one chunk
    (edge tiles are smaller). Every cell lands in exactly one chunk. The scheduler's TSP chunks and a packed
    colocated worker's (``classic_chunks``) both come from here."""
    if chunk_generations < 1 or chunk_timesteps < 1:
        raise ValueError("chunk shape must be at least 1 x 1")
    out = []
    for t0 in range(0, num_trained, chunk_timesteps):
        ts = range(t0, min(t0 + chunk_timesteps, num_trained))
        for g0 in range(0, len(gens), chunk_generations):
            out.append(tuple((g, t) for t in ts for g in gens[g0:g0 + chunk_generations]))
    return out


@lru_cache(maxsize=4096)
def _grid(gens: tuple[int, ...], num_trained: int, chunk_generations: int,
          chunk_timesteps: int) -> tuple[tuple[Cell, ...], ...]:
    """``tile_grid`` as a tuple, cached: the scheduler cuts the same grid at every group's release."""
    return tuple(tile_grid(gens, num_trained, chunk_generations, chunk_timesteps))


def gang_size(pending: Sequence[tuple[int, int]], ranks: int, groups: Container[int] | None = None,
              across: bool = True) -> int:
    """Gang TAG (docs/architecture.md, "Sharded trainer pool"): how many of the ``pending`` fragments ((group,
    size) in dispatch order) the next TAG action of a trainer of ``ranks`` ranks takes: the leading run, at most
    ``ranks`` of them, of fragments of ``groups`` (None: any group; the round's groups), of one or several
    prompt groups (``across``; else of the head fragment's group only: ``StepPlan.gang_groups``). A shard
    group's ranks split the generations round-robin and sample their shares data-parallel inside one
    collective, so a gang of m fragments of size f gives each rank about m f / ranks; 1 on a replicated rank.
    0 when nothing of ``groups`` leads the pending list."""
    n = 0
    for g, _ in pending[:max(1, ranks)]:
        if (groups is not None and g not in groups) or (not across and g != pending[0][0]):
            break
        n += 1
    return n


def merge_fragments(fragments: Sequence[Fragment]) -> Fragment:
    """One fragment of the generations of ``fragments`` (consecutive fragments of one group)."""
    first = fragments[0]
    if any(f.step != first.step or f.group != first.group for f in fragments):
        raise ValueError(f"a gang merges fragments of one group of one step (got {fragments!r})")
    return first if len(fragments) == 1 else Fragment(first.step, first.group,
                                                      tuple(i for f in fragments for i in f.generations))


def gang_parts(fragments: Sequence[Fragment]) -> tuple[Fragment, ...]:
    """The parts of a gang of consecutive ``fragments`` (dispatch order): one merged fragment per prompt group,
    in group order (``Generate.fragment`` and ``Generate.more``)."""
    return tuple(merge_fragments(list(p)) for _, p in groupby(fragments, key=lambda f: f.group))


def gang_shares(parts: Sequence[Fragment], ranks: int) -> list[list[Fragment]]:
    """Rank i's share of a gang's ``parts`` on a shard group of ``ranks`` ranks: the union of the parts'
    generations in order, position j to rank j mod ranks, as one fragment per part (empty where the rank has
    none of it). Each rank then holds ceil or floor of (gang size / ranks) generations, the per-rank batch the
    cost model prices (``rank_share``)."""
    out: list[list[Fragment]] = [[] for _ in range(ranks)]
    j = 0  # the union's position of the part's first generation
    for p in parts:
        for r in range(ranks):
            out[r].append(Fragment(p.step, p.group, p.generations[(r - j) % ranks::ranks]))
        j += p.size
    return out


def plan_fragment_count(plan: StepPlan, fragment: Fragment) -> int:
    """How many of the plan's fragments ``fragment`` is the union of (1 for a plan fragment, m for a gang of
    m); 0 when it is not a union of whole, consecutive plan fragments of its group."""
    blocks = [f.generations for f in group_fragments(plan, fragment.step, fragment.group)]
    for i in range(len(blocks)):
        joined: tuple[int, ...] = ()
        for n, b in enumerate(blocks[i:], 1):
            joined += b
            if joined == fragment.generations:
                return n
    return 0


def rank_share(items: int, ranks: int) -> int:
    """Items one rank handles when a shard group of ``ranks`` ranks splits an action of ``items`` cells or
    generations: ceil(items / ranks) (the runtime's ``train.sharding.rank_cells`` and the generation split)."""
    return -(-max(1, items) // max(1, ranks))


def busy_share(items: int, ranks: int) -> float:
    """Share of a shard group's rank-seconds an action of ``items`` spends working:
    items / (ranks x ceil(items / ranks)); the rest of its ranks wait inside the collective."""
    return min(1.0, items / (max(1, ranks) * rank_share(items, ranks)))


def tiles_makespan(sizes: Sequence[int], train_time: Callable[[int], float], trainers: int) -> float:
    """Predicted seconds to train one group whose chunks have ``sizes`` cells on ``trainers`` scheduler trainers:
    sum_i t(c_i) / N + (1 - 1/N) max_i t(c_i), Graham's list-scheduling bound (the load plus the last chunk's
    tail). On one trainer (one shard group) it is the serial sum, whatever the chunk sizes: the per-rank share
    and the last partial round of each chunk are inside ``train_time`` (the cost of a chunk on its group)."""
    times = [train_time(c) for c in sizes]
    n = max(1, trainers)
    return sum(times) / n + (1.0 - 1.0 / n) * max(times, default=0.0)


def choose_chunk_shape(generations: int, trained: int, trainers: int, train_time: Callable[[int], float],
                       max_cells: int) -> tuple[int, int]:
    """The TSP chunk shape (chunk_generations, chunk_timesteps), at most ``max_cells`` cells, whose actual tiles
    (``tile_grid``, edge tiles included) train one group fastest by ``tiles_makespan``; ties go to the larger
    chunk (fewer forwards). The planner prices ``train_time`` from its cost model; the runtime's
    ``chunk_cells: auto`` from the per-rank cells (``rank_share``)."""
    best, shape, cost = None, (1, 1), cache(train_time)
    for cg in range(1, generations + 1):
        for cs in range(1, trained + 1):
            if cg * cs > max(1, max_cells):
                continue
            key = (round(tiles_makespan(_tile_sizes(generations, trained, cg, cs), cost, trainers), 9), -cg * cs, -cg)
            if best is None or key < best:
                best, shape = key, (cg, cs)
    return shape


@lru_cache(maxsize=4096)
def _tile_sizes(generations: int, trained: int, chunk_generations: int, chunk_timesteps: int) -> tuple[int, ...]:
    """The cells of each tile of ``tile_grid`` over ``generations`` x ``trained``, cached (every candidate of a
    search weighs the same shapes)."""
    return tuple(len(t) for t in tile_grid(range(generations), trained, chunk_generations, chunk_timesteps))


def tsp_chunks(plan: StepPlan, step: int, group: int, round: int = 0) -> list[Chunk]:
    """The TSP chunks of one group: ``tile_grid`` of its G x S grid by ``chunk_generations x chunk_timesteps``."""
    g, s = plan.generations, plan.trained_timesteps
    return [Chunk(step, group, cells, round)
            for cells in _grid(tuple(range(g)), s, min(plan.chunk_generations, g), min(plan.chunk_timesteps, s))]


def classic_shard(plan: StepPlan, group: int, rank_index: int) -> tuple[int, ...]:
    """Generations of ``group`` in the data-parallel shard of trainer rank ``rank_index``: generation i of the
    group (flat index k = group x G + i) goes to rank k mod N in a pipelined mode, else to rank floor(k N / B)."""
    return classic_shards(plan, group)[rank_index]


def classic_shards(plan: StepPlan, group: int) -> tuple[tuple[int, ...], ...]:
    """Every trainer rank's ``classic_shard`` of ``group``, in rank order (cached)."""
    return _shards(len(plan.trainers), plan.generations, plan.batch, plan.mode.pipelined, group)


@lru_cache(maxsize=65536)
def _shards(n: int, g: int, b: int, pipelined: bool, group: int) -> tuple[tuple[int, ...], ...]:
    """Every rank's ``classic_shard`` of ``group``, cached: the scheduler asks at every group's release and round."""
    out: list[list[int]] = [[] for _ in range(n)]
    for i in range(g):
        k = group * g + i
        out[k % n if pipelined else k * n // b].append(i)
    return tuple(tuple(s) for s in out)


def classic_chunks(plan: StepPlan, step: int, group: int, round: int = 0) -> dict[int, list[Chunk]]:
    """rank index -> that rank's chunks of the group: one per trained timestep over its shard, or (a ``packed``
    plan) ``tile_grid`` of its shard's grid by the chunk shape (``classic_cells``)."""
    return {r: [Chunk(step, group, c, round) for c in cells] for r, cells in classic_cells(plan, group).items()}


def classic_cells(plan: StepPlan, group: int) -> dict[int, tuple[tuple[Cell, ...], ...]]:
    """rank index -> the cells of each of that rank's ``classic_chunks`` of ``group`` (ranks with an empty shard
    left out). Cached by shape: the scheduler counts a round's chunks and cuts them at every group's release."""
    s = plan.trained_timesteps
    return {r: _grid(shard, s, min(plan.chunk_generations, len(shard)), min(plan.chunk_timesteps, s))
            if plan.packed else _per_timestep(shard, s)
            for r, shard in enumerate(classic_shards(plan, group)) if shard}


@lru_cache(maxsize=4096)
def _per_timestep(shard: tuple[int, ...], num_trained: int) -> tuple[tuple[Cell, ...], ...]:
    """The unpacked layout's chunks of ``shard``: one per trained timestep j, every generation of the shard at j."""
    return tuple(tuple((i, j) for i in shard) for j in range(num_trained))


def grid_cells(groups: Sequence[Hashable], generations: int, trained: int) -> set[tuple[Hashable, int, int]]:
    """A step's training grid, the one definition: (group key, generation, trained-timestep position) for
    every cell of every group (group key: the group's index or its prompt uid)."""
    return {(k, i, j) for k in groups for i in range(generations) for j in range(trained)}
