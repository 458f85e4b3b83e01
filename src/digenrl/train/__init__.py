"""Chunked training of the (generation x trained timestep) grid inside a per-step gradient transaction."""

from digenrl.train.chunk_loss import CellStats, LossSettings, train_cells
from digenrl.train.chunks import make_chunks
from digenrl.train.transaction import GradientTransaction, TransactionError

__all__ = ["CellStats", "LossSettings", "train_cells", "make_chunks", "GradientTransaction", "TransactionError"]
