"""DigenRL: disaggregated, bubble-free RL post-training for diffusion / flow-matching generators.

See docs/architecture.md for the terms used throughout: step, trajectory, fragment, chunk, gradient
transaction, GAP / TSP / TAG / BTS / TCSS.
"""

__version__ = "0.1.0"
