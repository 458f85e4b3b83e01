"""Named variants of the roofline cost model for the question "what if the generator pool samples faster?"
(docs/where_disaggregation_wins.md, ``benchmarks/where_wins.py``). The colocated baselines as the peers run
them are in ``sim.baselines``.

``GeneratorPath`` prices how each worker samples, the lever a dedicated pool has and a colocated trainer has not
without switching costs (``generator.*``, docs/fast_generator.md):

* **compiled / inference-optimised** (``speedup``): the generator pool's denoising forwards and VAE decodes run
  ``speedup`` times faster than on a training rank. ``COMPILED_SPEEDUP`` is the public figure of one such
  optimisation: FLUX.1-dev, 1024 px, 28 steps on one H100, 6.71 s eager against 4.30 s with torch.compile (xDiT
  docs/performance/flux.md), 6.71 / 4.30 = 1.560 (an assumed 1.5, ``COMPILED_SPEEDUP_BEFORE``, until
  ``benchmarks/anchors.py`` re-fit it to the anchor).
* **LoRA merged or not** (``merged``): with LoRA, a worker that samples with the adapters unmerged (a training
  module: a TAG-ing trainer rank, flow_grpo's loop, a generator without ``generator.merge_lora``) pays
  ``UNMERGED_LORA_SLOWDOWN`` on every denoising forward; a generator that merges the adapters into its weights
  once per version does not (the merge itself is r-rank GEMMs over the adapted layers, negligible next to a
  fragment). The factor is the public figure: a LoRA rollout 28% slower than the same rollout without LoRA,
  from the unmerged adapter matmuls (verl-omni issue 248), i.e. 1.28. The roofline's own denoise prices the
  merged forward (it counts no adapter FLOPs), so::

      denoise(pool) = roofline denoise x (1.28 if LoRA and the pool samples unmerged) / (speedup if the pool is
                      the generator pool)

  A colocated rank's sampling is not wrapped here: the idealised bound may merge before it samples (a bound),
  and flow_grpo's loop prices its own unmerged sampling (``sim.baselines.FlowGRPOLoop``).

It wraps a ``RooflineCost`` (``base``), so the planner's memory limits still come from the roofline.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..schedule.cost import GENERATOR
from .roofline import RooflineCost

FAST_OPS = ("denoise", "vae_decode")
COMPILED_SPEEDUP_BEFORE = 1.5
COMPILED_SPEEDUP = 6.71 / 4.30
UNMERGED_LORA_SLOWDOWN = 1.28


@dataclass
class GeneratorPath:
    base: RooflineCost
    speedup: float = 1.0
    merged: bool = False
    unmerged_slowdown: float = UNMERGED_LORA_SLOWDOWN

    def __post_init__(self) -> None:
        if not self.speedup >= 1.0:
            raise ValueError(f"speedup: a generator speed-up must be >= 1 (got {self.speedup})")
        if not self.unmerged_slowdown >= 1.0:
            raise ValueError(f"unmerged_slowdown: must be >= 1 (got {self.unmerged_slowdown})")

    def time(self, op: str, batch: int, pool: str) -> float:
        t = self.base.time(op, batch, pool)
        if self.base.colocated:
            return t
        generator = pool == GENERATOR
        if op == "denoise" and self.base.lora and not (generator and self.merged):
            t *= self.unmerged_slowdown
        if generator and op in FAST_OPS:
            t /= self.speedup
        return t


def FastGenerators(base: RooflineCost, factor: float = COMPILED_SPEEDUP) -> GeneratorPath:
    """The generator pool ``factor`` times faster, its LoRA (if any) merged: the whole fast path."""
    return GeneratorPath(base, speedup=factor, merged=True)


__all__ = ["COMPILED_SPEEDUP", "COMPILED_SPEEDUP_BEFORE", "FAST_OPS", "FastGenerators", "GeneratorPath",
           "UNMERGED_LORA_SLOWDOWN"]
