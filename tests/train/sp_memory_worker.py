"""Processes of the sequence-parallel memory-plan test (spawned; gloo on CPU): each rank counts the allocations of
training its share of the sequence (``models.memory_probe.measure_training_peak``) and writes ``out/rank{r}.json``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch


def run(rank: int, world: int, port: int, family: str, layers: dict, tokens: tuple, lora: int, out: str) -> None:
    import torch.distributed as dist

    from digenrl.models.memory_probe import measure_training_peak

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        m = measure_training_peak(family, layers=layers, lora_rank=lora, img_tokens=tokens[0], txt_tokens=tokens[1],
                                  batch=2, autocast_dtype=torch.bfloat16, dtype=torch.bfloat16, shape_only=True,
                                  sequence_group=dist.group.WORLD)
        Path(out, f"rank{rank}.json").write_text(json.dumps(m))
        dist.barrier()  # rank 0 hosts the store: it stays until every rank is done
    finally:
        dist.destroy_process_group()
    os._exit(0)
