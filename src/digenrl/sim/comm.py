"""Where ranks sit and what their collectives cost: the testbed's nodes, NVLink inside a node, NICs across.

GPUs are numbered in slots: the testbed's first kind fills slots ``0 .. count - 1``, node after node of
``node_gpus``; its second kind (heterogeneous) starts on a fresh node. Every GPU has its own NIC of
``net_gbit`` (rail-optimised servers) and reaches the GPUs of its node at ``GPU.intra_node_gbs`` (NVLink, or
PCIe where the part has none). Pools are packed (``pool_slots``): the trainer pool first, from its kind's first
slot, the generators after it (or from their own kind's first slot), so a collective of the trainers spans as
few nodes as possible; a colocated run's ranks fill slots from 0.

Ring collectives (NCCL's ring algorithm, one ring per NIC rail): an all-gather or reduce-scatter of ``B``
bytes in total over ``n`` ranks takes::

    t = B (n - 1) / n / bus,      an all-reduce twice that,

with the bus bandwidth set by where the ranks sit (``bus_bytes_s``)::

    bus = intra(node)                                     all ranks on one node
    bus = min over nodes v of  r_v x nic       (r_v = 1)  ranks on several nodes: each node's r_v ranks use
                               min(intra(v), r_v x nic)   their r_v NICs; the slowest node sets the pace

so an all-gather inside one HGX node runs at NVLink rate (450 GB/s one way on an H100), one across nodes with
8 ranks per node at 8 NICs' rate capped by NVLink, and one with a single rank per node at one NIC's rate.
Point-to-point transfers between two groups (a publish, trajectories) run at one NIC's rate, or at the
intra-node rate when both groups sit on one node (``p2p_bytes_s``).

All-to-all (``all_to_all_s``, Ulysses sequence parallelism): each of the ``d`` ranks holds ``B`` bytes and sends
each other rank 1 / d of them, (d - 1) / d of B in all; the share bound for the ``d_v`` ranks of its own node goes
over NVLink, the rest through its NIC, both at once, and the slowest rank sets the pace::

    t = max over ranks of  max(B (d_v - 1) / d / intra(v),  B (d - d_v) / d / nic)

inside one node ``B (d - 1) / d / intra``.

Overlap with compute (``overlapped``): a share ``x`` of an action's communication cannot hide behind its
compute (the first block's gather and the last block's reduce-scatter of a pass, NCCL kernels taking SMs from
the matmuls), the rest can::

    t = x comm + max(compute, (1 - x) comm)

``x = 0`` is ``max(compute, comm)`` (perfect overlap), ``x = 1`` is ``compute + comm`` (none).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .presets import GPU, Testbed

GB = 1e9

# The exposed share of overlapped communication (``Assumptions.exposed_comm``). FSDP prefetches the next block's
# all-gather while the current block computes, so per pass the first block's gather and the last block's
# reduce-scatter stay exposed: 1 / L of each with L = 40-60 blocks in these models (2-3 %). The rest of the
# default is the SMs NCCL's kernels take from the overlapped matmuls and the prefetch's bubbles; no public
# measurement of it for these models was found, so it is an assumption, and docs/where_disaggregation_wins.md
# shows the figures at 0, 0.25 and 0.5 beside it.
EXPOSED_COMM_SHARE = 0.1


def overlapped(compute_s: float, comm_s: float, exposed: float) -> float:
    """``exposed * comm + max(compute, (1 - exposed) * comm)`` (module docstring)."""
    if not 0.0 <= exposed <= 1.0:
        raise ValueError(f"exposed_comm: must lie in [0, 1] (got {exposed})")
    return exposed * comm_s + max(compute_s, (1.0 - exposed) * comm_s)


@dataclass(frozen=True)
class Fabric:
    """The testbed's GPUs by slot: which node each sits on and how fast it talks inside that node."""

    testbed: Testbed

    def kind_start(self, gpu: GPU) -> int:
        """First slot of ``gpu``'s kind (the second kind starts on a fresh node after the first)."""
        tb = self.testbed
        if tb.gpu2 is not None and gpu.name == tb.gpu2.name and gpu.name != tb.gpu.name:
            return -(-tb.count // tb.node_gpus) * tb.node_gpus
        return 0

    def node_of(self, slot: int) -> int:
        return slot // self.testbed.node_gpus

    def gpu_of_node(self, node: int) -> GPU:
        tb = self.testbed
        if tb.gpu2 is not None and node * tb.node_gpus >= self.kind_start(tb.gpu2):
            return tb.gpu2
        return tb.gpu

    def bus_bytes_s(self, slots: list[int]) -> float:
        """Ring bus bandwidth of a collective over ``slots`` (module docstring)."""
        per_node = Counter(self.node_of(s) for s in slots)
        intra = {v: self.gpu_of_node(v).intra_node_gbs * GB for v in per_node}
        if len(per_node) == 1:
            return next(iter(intra.values()))
        nic = self.testbed.net_bytes_s
        return min(r * nic if r == 1 else min(intra[v], r * nic) for v, r in per_node.items())

    def ring_s(self, nbytes: float, slots: list[int]) -> float:
        """All-gather or reduce-scatter of ``nbytes`` in total over ``slots``: B (n - 1) / n / bus."""
        n = len(slots)
        return 0.0 if n <= 1 else nbytes * (n - 1) / n / self.bus_bytes_s(slots)

    def allreduce_s(self, nbytes: float, slots: list[int]) -> float:
        """Ring all-reduce of ``nbytes`` over ``slots``: a reduce-scatter and an all-gather."""
        return 2.0 * self.ring_s(nbytes, slots)

    def all_to_all_s(self, nbytes: float, slots: list[int]) -> float:
        """All-to-all of ``slots`` in which every rank holds ``nbytes`` (module docstring)."""
        d = len(slots)
        if d <= 1:
            return 0.0
        per_node = Counter(self.node_of(s) for s in slots)
        return max(max(nbytes * (r - 1) / d / (self.gpu_of_node(v).intra_node_gbs * GB),
                       nbytes * (d - r) / d / self.testbed.net_bytes_s) for v, r in per_node.items())

    def p2p_bytes_s(self, a: list[int], b: list[int]) -> float:
        """Between two groups: the intra-node rate when all of both sit on one node, else one NIC's."""
        nodes = {self.node_of(s) for s in list(a) + list(b)}
        if len(nodes) == 1:
            return self.gpu_of_node(next(iter(nodes))).intra_node_gbs * GB
        return self.testbed.net_bytes_s

    def nodes(self, slots: list[int]) -> set[int]:
        return {self.node_of(s) for s in slots}


def pool_slots(fabric: Fabric, gen_gpu: GPU, n_gen: int, train_gpu: GPU, n_train: int,
               colocated: bool) -> tuple[list[int], list[int]]:
    """(generator slots, trainer slots), packed as the module docstring says. A colocated run (``n_gen`` 0)
    fills slots from its kind's first slot; one over both kinds (a GPU that is neither kind,
    ``Testbed.weakest``, or more ranks than its kind has) takes its kind's slots, then the other's."""
    tb = fabric.testbed
    own = tb.count2 if tb.gpu2 is not None and train_gpu.name == tb.gpu2.name != tb.gpu.name else tb.count
    if colocated:
        if train_gpu.name not in (tb.gpu.name, getattr(tb.gpu2, "name", None)) or n_train > own:
            # over both kinds (lock-step, or a load-balanced colocation): the first kind, then the second's nodes
            first = list(range(tb.count))
            second = list(range(fabric.kind_start(tb.gpu2), fabric.kind_start(tb.gpu2) + tb.count2)) if tb.gpu2 else []
            if train_gpu.name == getattr(tb.gpu2, "name", None):
                first, second = second, first
            return [], (first + second)[:n_train]
        start = fabric.kind_start(train_gpu)
        return [], list(range(start, start + n_train))
    t0 = fabric.kind_start(train_gpu)
    trainers = list(range(t0, t0 + n_train))
    g0 = t0 + n_train if gen_gpu.name == train_gpu.name else fabric.kind_start(gen_gpu)
    return list(range(g0, g0 + n_gen)), trainers


__all__ = ["EXPOSED_COMM_SHARE", "Fabric", "overlapped", "pool_slots"]
