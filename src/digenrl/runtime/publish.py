"""Versioned weight publishing: trainers -> every generator, after each commit.

The initial weights are version 0; the commit of step k makes version k + 1. What moves is
``policy.trainable_state_dict()`` (LoRA adapters only under LoRA). Three paths (``runtime.publish``):

* ``object_store`` (default): rank 0 returns a CPU copy of the state as the call's result (the Ray object
  store); the driver passes its ref with the first ``Generate`` of that version to each generator, which
  fetches it and swaps it in before sampling. A generator busy with a (TCSS) fragment is never waited for.
* ``broadcast``: rank 0 and the generators share a torch.distributed group (world: trainers 0..N_t-1, then
  generators N_t..N_t+N_g-1); rank 0 broadcasts each tensor (sorted by name), each generator receives into
  fresh buffers and stages them in its ``WeightInbox``, joining when it is free (in ``full`` mode a publish can
  wait for in-flight fragments). A sharded pool first gathers the full state on every rank.
* ``stream``: no gather. Each sender (rank 0 of a replicated pool; every rank of the first shard group of a
  sharded one) broadcasts copies of its own shards asynchronously and goes on training while they drain; each
  generator joins every sender's shards along dim 0 (FSDP2's ``torch.chunk`` split). A sender waits for its
  sends before its next commit or publish (``StepPlan.publish_streams``).

Receiving never touches the live weights: a version is swapped in only at the start of a fragment that asks for
it, so every trajectory is produced by the one version it records."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import NamedTuple, Sequence

from digenrl.control.run_plan import shard_groups


class WeightInbox:
    """Staged weight versions of one generator (broadcast path), handed over between fragments."""

    def __init__(self) -> None:
        self._staged: dict[int, dict] = {}

    def put(self, version: int, state: dict) -> None:
        self._staged[version] = state

    def versions(self) -> list[int]:
        return sorted(self._staged)

    def take(self, version: int) -> dict | None:
        """The state of ``version`` (and forget it and every older one); None if it was never received."""
        state = self._staged.get(version)
        for v in [v for v in self._staged if v <= version]:
            del self._staged[v]
        return state


@dataclass(frozen=True)
class GroupSpec:
    """How one worker joins torch.distributed (the driver builds one per worker)."""

    init_method: str              # tcp://ip:port of the rendezvous (hosted on trainer rank 0's node)
    backend: str                  # "gloo" | "nccl"
    world: int
    rank: int
    trainer_ranks: tuple[int, ...]
    shard_size: int = 0           # ranks per shard group under hybrid sharding (train.shard_groups > 1), else 0
    stream_ranks: tuple[tuple[int, ...], ...] = ()  # per sender of a broadcast / stream publish: (sender,
    # generator ranks...)
    sequence_groups: tuple[tuple[int, ...], ...] = ()  # the sequence-parallel groups: the trainers' lanes
    # (train.sequence_parallel) and the generators' (runtime.generator_sequence_parallel), in this order


class ProcessGroups(NamedTuple):
    """The groups a worker takes part in (None: the default world, or not a member).

    trainer: every trainer rank (the unsharded commit's all-reduce); shard: the worker's shard group (FSDP's
    mesh; the trainer group without hybrid sharding); replica: the ranks holding the same shard in every shard
    group (hybrid sharding's commit all-reduce), None without hybrid sharding; streams: (sender rank, group) of
    each publish group the worker is in (a sender's own; a generator's, one per sender in sender order);
    sequence: the worker's sequence-parallel group (a trainer lane or a generator's ranks, which split each
    sequence), None without."""

    trainer: object = None
    shard: object = None
    replica: object = None
    streams: tuple = ()
    sequence: object = None


def hybrid_layout(trainer_ranks: Sequence[int], shard_size: int) -> tuple[list[list[int]], list[list[int]]]:
    """(shard groups, replica groups) of ``trainer_ranks``: the consecutive blocks of ``control.run_plan.
    shard_groups`` (the scheduler's shard groups, same order); replica j = the j-th rank of every group (they
    hold the same shards)."""
    ranks = tuple(trainer_ranks)
    if shard_size < 1 or len(ranks) % shard_size:
        raise ValueError(f"{len(ranks)} trainer ranks do not split into shard groups of {shard_size}")
    _, blocks = shard_groups(ranks, True, len(ranks) // shard_size)
    shards = [list(b) for b in blocks.values()]
    return shards, [list(r) for r in zip(*shards)]


def init_groups(setup: GroupSpec, timeout_s: float) -> ProcessGroups:
    """Join the world and create every group (collective over the world: every process creates every group,
    in the same order). ``timeout_s`` (``runtime.collective_timeout_s``) bounds the rendezvous and every
    collective of each group (``new_group`` would otherwise take torch's 30 min default, not the world's):
    under gloo a collective that waits longer raises; under NCCL its watchdog aborts the process."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(setup.backend, init_method=setup.init_method, world_size=setup.world,
                            rank=setup.rank, timeout=timeout)
    trainer_group = (dist.new_group(list(setup.trainer_ranks), timeout=timeout)  # the world holds the generators
                     if setup.world > len(setup.trainer_ranks) else None)

    def mine(groups, default=None):
        """Create every one of ``groups`` (in order, on every process); the one holding this rank, else ``default``."""
        found = default
        for ranks in groups:
            pg = dist.new_group(list(ranks), timeout=timeout)
            found = pg if setup.rank in ranks else found
        return found

    streams = tuple((ranks[0], pg) for ranks in setup.stream_ranks if (pg := mine([ranks])) is not None)
    hybrid = setup.shard_size and setup.shard_size < len(setup.trainer_ranks)
    shards, replicas = hybrid_layout(setup.trainer_ranks, setup.shard_size) if hybrid else ([], [])
    return ProcessGroups(trainer_group, mine(shards, trainer_group), mine(replicas), streams,
                         mine(setup.sequence_groups))


def _receive_like(policy, layout: dict | None) -> dict:
    """name -> (shape, dtype, device) of the tensors a publish sends: the policy's trainable ones, or ``layout``
    (name -> (shape, dtype): a generator whose inference copy holds them in another dtype,
    ``models.fast_generator``) on the policy's device."""
    like = policy.trainable_state_dict()
    if layout is None:
        return {n: (tuple(t.shape), t.dtype, t.device) for n, t in like.items()}
    return {n: (tuple(shape), dtype, like[n].device) for n, (shape, dtype) in layout.items()}


def local_state(state: dict) -> dict:
    """Copies of this rank's own part of ``state`` (a DTensor's local shard, a plain tensor whole): what a
    sender streams. Copies, so that the sends never read weights that a later commit or swap changes."""
    return {name: (t.to_local() if hasattr(t, "to_local") else t).detach().clone() for name, t in state.items()}


def stream_send(state: dict, src: int, group) -> list:
    """A sender's side of a publish: one asynchronous broadcast per tensor (sorted by name) from world rank
    ``src`` over its group (a broadcast publish waits for them at once); the works, to ``wait`` on before the
    next commit or publish."""
    import torch.distributed as dist

    return [dist.broadcast(state[name].detach().contiguous(), src=src, group=group, async_op=True)
            for name in sorted(state)]


def shard_shape(shape, senders: int, index: int) -> tuple[int, ...]:
    """The shape of sender ``index``'s part of a tensor of ``shape`` split over ``senders`` ranks along dim 0 as
    FSDP2 shards it (``torch.chunk``: chunks of ceil(n / senders) rows, the last smaller, trailing ranks empty)."""
    shape = tuple(shape)
    if senders == 1:
        return shape
    if not shape:
        raise ValueError("a 0-dim tensor cannot be sharded along dim 0")
    step = -(-shape[0] // senders)
    rows = max(0, min(step, shape[0] - index * step))
    return (rows,) + shape[1:]


def stream_receive(policy, streams: Sequence[tuple[int, object]], layout: dict | None = None) -> dict:
    """Generator side: receive every sender's shards into fresh buffers (all at once, asynchronously) and join
    them along dim 0 into the full trainable state (the live weights are untouched); a broadcast publish is
    the case of one sender, rank 0, sending the whole state."""
    import torch
    import torch.distributed as dist

    like = _receive_like(policy, layout)
    n = len(streams)
    parts: dict[str, list] = {name: [] for name in sorted(like)}
    works = []
    for i, (src, group) in enumerate(streams):
        for name in sorted(like):
            shape, dtype, device = like[name]
            buf = torch.empty(shard_shape(shape, n, i), dtype=dtype, device=device)
            works.append(dist.broadcast(buf, src=src, group=group, async_op=True))
            parts[name].append(buf)
    for w in works:
        w.wait()
    return {name: (torch.cat(p, dim=0) if n > 1 else p[0]) for name, p in parts.items()}
