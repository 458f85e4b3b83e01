"""The roofline's memory: the memory plan of ``train.memory`` (what ``digenrl train`` refuses a config with), the one
activation-memory model of the project, applied to the simulator's pools.

A trainer rank holds its plan (``plan_memory``, with its chunk's cells of activations), a generator rank its
``generator_bytes`` (with its fragment's sampling activations). The capacity of a GPU is ``GPU.memory_gb`` GiB, the
unit of ``train.memory_gb``. The plan's inputs (``preset_inputs``) are what the roofline prices: bf16 weights with
fp32 master weights and moments (bf16 mixed precision), LoRA of the workload's rank, recomputation as
``Training.recompute``, a prompt cache (no text encoders), the efficiency fit's reserve. (A config's own memory plan
refuses its candidates first: ``sim.config_source``.)

While a colocated rank generates it holds its plan's ``MemoryPlan.sampling_state`` (its gradients are free, the
commit consumed them, and so are autocast's copies, which exist in a backward only); its optimizer moments (and
EMA) are what it can offload to host (``sim.colocation``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..train.memory import GiB, MemoryPlan, PlanInputs, generator_bytes, plan_memory, samples_that_fit
from .colocation import RankMemory


def preset_inputs(model, workload, training, reserve_gb: float) -> PlanInputs:
    """The plan's inputs for a preset (module docstring); ranks and degrees are set per pool (``PoolMemory``).
    The algorithm's shadows of the trainable weights: DiffusionNFT's soft old policy, recompute's step-start
    snapshot (``sim.algorithms``)."""
    alg = workload.algorithm
    return PlanInputs(model.spec.kind, workload.height, workload.width, workload.frames, text_tokens=model.text_tokens,
                      lora_rank=training.lora_rank or None, model_dtype="bfloat16", mixed_precision="bf16",
                      activation_checkpointing=training.recompute, reserve_gb=reserve_gb,
                      param_copies=int(alg.soft_old) + int(alg.recompute_share > 0))


@dataclass(frozen=True)
class PoolMemory:
    """Bytes of one trainer rank and one generator rank, and what fits in their GPUs."""

    plan: MemoryPlan            # a trainer rank's
    generator: PlanInputs       # a generator rank's inputs
    train_capacity: float       # bytes
    gen_capacity: float

    @classmethod
    def of(cls, base: PlanInputs, *, ranks: int, sharded: bool, sequence: int, train_forwards: int,
           sample_forwards: int, generator_sequence: int, train_gb: float, gen_gb: float,
           inference_copy: bool = False) -> "PoolMemory":
        """``ranks``: the ranks the state is sharded over (a shard group's; 1 unsharded); ``sequence``: ranks of a
        trainer lane; ``train_forwards`` / ``sample_forwards``: forwards per training cell / per sampling step;
        ``inference_copy``: a trainer rank keeps TAG's unsharded copy (``training.tag_copy``) beside its shards."""
        trainer = replace(base, sharding="fsdp" if sharded else "none", ranks=ranks if sharded else 1,
                          sequence_parallel=sequence, forwards_per_cell=train_forwards, inference_copy=inference_copy)
        gen = replace(base, sequence_parallel=generator_sequence, forwards_per_cell=sample_forwards)
        return cls(plan_memory(trainer), gen, train_gb * GiB, gen_gb * GiB)

    @property
    def max_cells(self) -> int:
        """Cells of one chunk a trainer rank fits (0: not even one)."""
        return self.plan.max_cells(self.train_capacity)

    def generation_bytes(self, samples: int) -> float:
        """Sampling activations of ``samples`` trajectories on one rank (no-grad forwards, CFG included)."""
        return generator_bytes(self.generator, samples)["activations"]

    @property
    def max_fragment(self) -> int:
        """Largest batch of trajectories a generator rank fits next to its replica (0: none)."""
        fixed = sum(generator_bytes(self.generator, 0).values())
        per = self.generation_bytes(1)
        return samples_that_fit(self.gen_capacity, fixed, per)

    def colocated(self) -> RankMemory:
        """What a colocated rank holds while it generates (module docstring), for ``sim.colocation``."""
        items = self.plan.items
        movable = items.get("optimizer", 0.0) + items.get("ema", 0.0)
        resident = self.plan.sampling_state() - items["reserve"] - movable
        return RankMemory(resident, movable, items["reserve"])


__all__ = ["PoolMemory", "preset_inputs"]
