"""Named variants of the roofline cost model, for the question "what if the generators are faster?"
(docs/where_disaggregation_wins.md, ``benchmarks/where_wins.py``). The colocated baselines as the peers run
them are in ``sim.baselines``.

* ``FastGenerators``: the generator pool runs its denoising forwards and VAE decodes ``factor`` times faster
  than the training ranks would: a dedicated pool can run an inference-optimised model (compiled, LoRA merged,
  inference dtype) that a colocated trainer cannot without switching costs. ``COMPILED_SPEEDUP`` is the public
  figure for one of those optimisations: FLUX.1-dev, 1024 px, 28 steps on one H100, 6.71 s eager against
  4.30 s with torch.compile (xDiT docs/performance/flux.md), a factor of 6.71 / 4.30 = 1.560. It was an
  assumption of 1.5 (``COMPILED_SPEEDUP_BEFORE``) until ``benchmarks/anchors.py`` re-fit it to the anchor.

It wraps a ``RooflineCost`` (``base``), so the planner's memory limits still come from the roofline.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..schedule.cost import GENERATOR
from .roofline import RooflineCost

FAST_OPS = ("denoise", "vae_decode")
COMPILED_SPEEDUP_BEFORE = 1.5
COMPILED_SPEEDUP = 6.71 / 4.30


@dataclass
class FastGenerators:
    base: RooflineCost
    factor: float = COMPILED_SPEEDUP

    def __post_init__(self) -> None:
        if not self.factor >= 1.0:
            raise ValueError(f"factor: a generator speed-up must be >= 1 (got {self.factor})")

    def time(self, op: str, batch: int, pool: str) -> float:
        t = self.base.time(op, batch, pool)
        if pool == GENERATOR and op in FAST_OPS and not self.base.colocated:
            return t / self.factor
        return t


__all__ = ["COMPILED_SPEEDUP", "COMPILED_SPEEDUP_BEFORE", "FAST_OPS", "FastGenerators"]
