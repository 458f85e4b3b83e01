"""The cost model's named assumptions: what no datasheet or config gives, each with its default and why.

* ``exposed_comm`` (``sim.comm.EXPOSED_COMM_SHARE``, 0.1): the share of an action's overlapped communication
  (FSDP gathers and reduce-scatters inside a forward/backward) that does not hide behind its compute:
  ``t = x comm + max(compute, (1 - x) comm)``; 0 is perfect overlap (the model before issue 36).
* ``attn_backward`` (``ATTN_BACKWARD_FACTOR``, 2.5): FLOPs of attention's backward over its forward's.
  FlashAttention's backward recomputes the scores and runs five matmuls (QK^T, dP = dO V^T, dV = P^T dO,
  dQ = dS K, dK = dS^T Q) against the forward's two: 2.5x (Dao, FlashAttention-2, arXiv 2307.08691, section 4,
  which counts the backward's FLOPs as 2.5x the forward's). A cell's training FLOPs are then
  ``fwd (L + A) + input grads (L + 2.5 A) + weight grads (L, full fine-tuning) + recomputed forward (L + A)``
  with ``L`` the linear and ``A`` the attention FLOPs of one forward (``RooflineCost.train_flops_per_cell``).
* ``train_efficiency`` (1.0): a training forward/backward's share of peak over an inference forward's at the
  same tokens (``sim.efficiency``'s fit is of inference). 1.0 is the assumption "training at inference
  efficiency": no public training step of these models separates the two (``benchmarks/anchors.py`` gives the
  value each training anchor would need, and does not apply one whose unknowns bracket the published figure).
"""

from __future__ import annotations

from dataclasses import dataclass

from .comm import EXPOSED_COMM_SHARE

ATTN_BACKWARD_FACTOR = 2.5


@dataclass(frozen=True)
class Assumptions:
    exposed_comm: float = EXPOSED_COMM_SHARE
    attn_backward: float = ATTN_BACKWARD_FACTOR
    train_efficiency: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 < self.train_efficiency <= 4.0:
            raise ValueError(f"train_efficiency: must lie in (0, 4] (got {self.train_efficiency})")
        if not 0.0 <= self.exposed_comm <= 1.0:
            raise ValueError(f"exposed_comm: must lie in [0, 1] (got {self.exposed_comm})")
        if not self.attn_backward >= 1.0:
            raise ValueError(f"attn_backward: must be >= 1 (got {self.attn_backward})")


DEFAULT = Assumptions()

__all__ = ["ATTN_BACKWARD_FACTOR", "Assumptions", "DEFAULT"]
