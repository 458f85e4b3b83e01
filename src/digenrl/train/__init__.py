"""Chunked training of the (generation x trained timestep) grid inside a per-step gradient transaction.

Chunks tile the grid with ``digenrl.schedule.layout.tile_grid`` (the scheduler's TSP chunks use the same).
"""

from digenrl.train.chunk_loss import CellStats, LossSettings, train_cells
from digenrl.train.transaction import GradientTransaction, TransactionError

__all__ = ["CellStats", "LossSettings", "train_cells", "GradientTransaction", "TransactionError"]
