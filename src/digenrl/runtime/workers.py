"""Declared worker interfaces: what the controller may call on a generator and on a trainer rank.

The controller holds worker handles (``pools.WorkerPools``: Ray actors, or objects of its own process);
``pools.call(worker, "method", *args)`` runs ``method`` of the protocol below on the worker and returns a ref of
its result. ``GeneratorWorker`` and ``TrainerWorker`` implement
these protocols (a test checks every method and its parameters), and the executor, the driver, the cluster
setup and the calibration call nothing else.
"""

from __future__ import annotations

from typing import Protocol

from digenrl.schedule import Chunk, Fragment

from .messages import ChunkResult, CommitResult, FragmentInfo, TimedResult
from .publish import GroupSpec


class WorkerAPI(Protocol):
    def ping(self) -> str:
        """The worker's id (liveness)."""

    def clock(self) -> float:
        """The worker's ``time.monotonic()``, the clock of its results' start / end stamps."""

    def node_endpoint(self) -> tuple[str, int]:
        """(node IP, a free TCP port there): a torch.distributed rendezvous hosted by this worker's node."""

    def setup_dist(self, spec: GroupSpec) -> bool:
        """Join the torch.distributed world and groups of ``spec``."""

    def calibration_start(self, gen_sizes: list[int], cell_sizes: list[int]) -> list[list[tuple]]:
        """Prepare the calibration's ops (``timing.Calibration``: generation; a trainer's training, commit and
        publish too); their keys in blocks."""

    def calibration_run(self, key: tuple) -> float:
        """Seconds of one execution of the op ``key`` (calibration: one call per execution)."""

    def calibration_end(self) -> bool:
        """Drop the calibration's ops (and the gradients they left)."""


class GeneratorAPI(WorkerAPI, Protocol):
    def generate(self, fragment: Fragment, version: int, weights: list | None = None) -> tuple[object, FragmentInfo]:
        """(trajectories, info) of ``fragment`` sampled, decoded and scored with ``version`` (swapped in first
        from ``weights`` = [published state ref], or from a staged broadcast)."""

    def load_weights(self, version: int, weights: list) -> TimedResult:
        """Swap ``version`` in now (version 0 before the run)."""

    def receive_broadcast(self, version: int) -> TimedResult:
        """Join rank 0's broadcast of ``version`` and stage it."""

    def receive_stream(self, version: int) -> TimedResult:
        """Receive every sender's shards of ``version``, join them and stage the state."""


class TrainerAPI(WorkerAPI, Protocol):
    def train(self, chunk: Chunk, refs: list, rewards: dict, parts: dict) -> ChunkResult:
        """Forward+backward of ``chunk`` into its round's gradient transaction (``refs``: its group's fragments;
        ``rewards`` / ``parts``: the rewards of the step's complete groups so far, ``WorkerExecutor.step_rewards``)."""

    def generate(self, fragment: Fragment, version: int) -> tuple[object, FragmentInfo]:
        """TAG / colocated generation with the rank's own weights, which must be ``version``."""

    def generate_gang(self, share: tuple[Fragment, ...], version: int) -> tuple:
        """A gang over several prompt groups (a shard group's TAG, or a packed colocated worker's share): this
        rank's share (one fragment per part) in one batch; returns one trajectory batch (or None) per part, then
        the tuple of per-part infos."""

    def commit(self, step: int, round: int, final: bool, rewards: dict, parts: dict) -> CommitResult:
        """Loss scale from the step's ``rewards`` (``train.loss_scale``), all-reduce, optimizer step of round
        ``round`` of ``step`` (a collective of every rank); ``final`` bumps the version."""

    def abort(self) -> int | None:
        """Drop the open transaction; returns its step."""

    def publish(self, version: int) -> tuple[dict, TimedResult]:
        """Rank 0: the object-store payload of ``version``."""

    def publish_broadcast(self, version: int) -> TimedResult:
        """Rank 0: broadcast ``version`` to the generators."""

    def publish_stream(self, version: int) -> TimedResult:
        """A sender: start streaming its shards of ``version`` to the generators; returns at once."""

    def evaluate(self, grid: int) -> TimedResult:
        """value = (eval reward, the first ``grid`` eval samples) with the (EMA) weights."""

    def checkpoint_bytes(self, meta: dict) -> TimedResult:
        """value = the bytes of the checkpoint of the (EMA) weights."""

    def pack_state(self, step: int, counters: dict) -> TimedResult:
        """value = the resumable state after ``step`` committed steps (rank 0, at a step boundary)."""

    def restore_state(self, data: bytes) -> int:
        """Load a resumable state; returns its version."""
