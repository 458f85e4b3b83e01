"""Chunked training of the (generation x trained timestep) grid inside a per-step gradient transaction.

The names below load lazily (PEP 562), so that torch-free modules of this package (``train.memory``, the
memory plan the simulator prices) can be imported without torch.
"""

from importlib import import_module

_EXPORTS = {
    "CellStats": "digenrl.train.chunk_loss", "LossSettings": "digenrl.train.chunk_loss",
    "train_cells": "digenrl.train.chunk_loss",
    "GradientTransaction": "digenrl.train.transaction", "TransactionError": "digenrl.train.transaction",
}  # fmt: skip

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'digenrl.train' has no attribute {name!r}")
