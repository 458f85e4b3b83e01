"""Chunked training of the (generation x trained timestep) grid inside a per-step gradient transaction.

The package itself imports nothing, so that torch-free modules of it (``train.memory``, the memory plan the
simulator prices) can be imported without torch; import the modules directly.
"""
