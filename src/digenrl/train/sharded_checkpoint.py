"""Resumable checkpoints of a sharded trainer pool (``train.sharding: fsdp``) in the run's checkpoint layout.

Every rank writes its shards of the weights, AdamW state and EMA with ``torch.distributed.checkpoint``
(``train.sharding.save_sharded``) into ``checkpoints/step_<k>.dcp.tmp``; after all ranks are done rank 0
renames it to ``step_<k>.dcp`` and returns the bytes of the metadata file (``train.checkpoint.pack`` of a
``TrainState`` without tensors, ``sharded`` naming the directory), which the controller writes atomically as
``step_<k>.safetensors``. The file therefore exists only once the directory is complete, and
``latest_checkpoint`` / ``keep_checkpoints`` work as for replicated runs. No rank ever holds the full state.
The metadata file records the size and sha256 of every file of the directory (``checkpoint.shard_manifest``, taken
by rank 0 once every rank wrote; ``verify_checkpoint``, hence every resume and recovery, checks them);
``restore_sharded_state`` checks that every recorded file is there with its size.
The run directory must be reachable under the same path from every trainer rank (a shared file system on a
multi-node cluster, as for any ``torch.distributed.checkpoint`` user).

Restoring (``restore_sharded_state``): every rank of a freshly sharded context loads its shards back in place
(``load_sharded``: the mesh may be the same size only; a resume with another ``runtime.trainers`` is refused
before anything starts, ``resume_config.check_resume_config``), then the version, EMA update count, fp16 loss scale and RNG.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from .checkpoint import (TrainState, check_closed, check_shards, checkpoint_dir, pack, restore_counters, run_state,
                         shard_manifest, sharded_dir_name)


def pack_sharded_state(ctx, run_dir: str | Path, *, step: int, counters: dict[str, Any] | None, rank: int) -> bytes | None:
    """Collective: every rank writes its shards; rank 0 returns the metadata file's bytes (others None)."""
    import torch.distributed as dist

    from .sharding import save_sharded  # (looked up at the call: tests/train/test_checkpoint_content.py patches it)

    check_closed(ctx)
    group = ctx.transaction.process_group
    d = checkpoint_dir(run_dir)
    final = d / sharded_dir_name(step)
    tmp = final.with_name(final.name + ".tmp")
    if rank == 0:
        d.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier(group=group)
    save_sharded(ctx, tmp)
    dist.barrier(group=group)
    if rank != 0:
        return None
    shards = shard_manifest(tmp)  # the file names inside stay those of the final directory
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return pack(run_state(ctx, step=step, counters=counters, model={}, optimizer={"state": {}, "param_groups": []},
                          ema=None, rng={"torch_cpu": torch.get_rng_state()}, sharded=final.name, shards=shards))


def restore_sharded_state(ctx, run_dir: str | Path, state: TrainState) -> None:
    """Load the shards named by ``state.sharded`` into the (already sharded) ``ctx``; version, EMA count, RNG."""
    from .sharding import load_sharded

    path = checkpoint_dir(run_dir) / state.sharded
    # (the sha256: latest_checkpoint, before the restore)
    check_shards(path, state.shards or {}, f"checkpoint of step {state.step}", digests=False)
    load_sharded(ctx, path)
    restore_counters(ctx, state)
