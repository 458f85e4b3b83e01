"""Cutting a group's training grid into chunks.

The training work of a prompt group is the grid G generations x S trained timesteps; a *cell* is
(generation index, position in the trained-step list). A *chunk* is a set of cells packed into one
forward/backward. ``make_chunks`` tiles the grid timestep-major (all generations of the first timesteps
first), ``chunk_timesteps`` x ``chunk_generations`` cells per chunk; every cell lands in exactly one chunk.
"""

from __future__ import annotations

from typing import Sequence

Cell = tuple[int, int]  # (generation index, trained-timestep position)


def make_chunks(gens: Sequence[int], num_trained: int, chunk_generations: int, chunk_timesteps: int) -> list[tuple[Cell, ...]]:
    if chunk_generations < 1 or chunk_timesteps < 1:
        raise ValueError("chunk shape must be at least 1 x 1")
    chunks = []
    for t0 in range(0, num_trained, chunk_timesteps):
        ts = range(t0, min(t0 + chunk_timesteps, num_trained))
        for g0 in range(0, len(gens), chunk_generations):
            gs = gens[g0 : g0 + chunk_generations]
            chunks.append(tuple((g, t) for t in ts for g in gs))
    return chunks
