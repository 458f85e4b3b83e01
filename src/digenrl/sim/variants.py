"""Named variants of the roofline cost model, for the questions "against which colocation?" and "what if the
generators are faster?" (docs/where_disaggregation_wins.md, ``benchmarks/where_wins.py``).

* ``PeerColocated``: colocation as the peers' training loops run it (DanceGRPO / flow_grpo style: one sample x
  one timestep per forward/backward through the FSDP module, gradients accumulated over the batch), i.e.
  ``train_chunk(c) = c x train_chunk(1)``: every cell pays its own forward/backward overheads, parameter
  gathers and kernel launch costs instead of being packed. Generation is unchanged.
* ``FastGenerators``: the generator pool runs its denoising forwards and VAE decodes ``factor`` times faster
  than the training ranks would (inference-only optimisations a dedicated pool can use: compiled / fused
  kernels, FP8, no optimizer state beside it); ``factor`` is an assumption, named and reported, never fitted.

Both wrap a ``RooflineCost`` (``base``), so the planner's memory limits still come from the roofline.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..schedule.cost import GENERATOR
from .roofline import RooflineCost

FAST_OPS = ("denoise", "vae_decode")


@dataclass
class PeerColocated:
    base: RooflineCost

    def time(self, op: str, batch: int, pool: str) -> float:
        if op == "train_chunk":
            return max(1, batch) * self.base.time(op, 1, pool)
        return self.base.time(op, batch, pool)


@dataclass
class FastGenerators:
    base: RooflineCost
    factor: float

    def __post_init__(self) -> None:
        if not self.factor >= 1.0:
            raise ValueError(f"factor: a generator speed-up must be >= 1 (got {self.factor})")

    def time(self, op: str, batch: int, pool: str) -> float:
        t = self.base.time(op, batch, pool)
        if pool == GENERATOR and op in FAST_OPS and not self.base.colocated:
            return t / self.factor
        return t


__all__ = ["FAST_OPS", "FastGenerators", "PeerColocated"]
