"""Memory per rank and the switch work of a colocated step, from hardware facts (bytes / bandwidth).

Bytes per rank: ``sim.memory.PoolMemory.colocated`` (what stays resident, what can move to host, the gradients,
free while the rank generates). The switch of one step (train -> generate -> train), per rank:

* sharded trainer: all-gather the shards into a bf16 inference copy, ring over the pool at the per-GPU link
  rate (2P (N-1)/N bytes), then hand the copy to the inference engine: VeRL-Omni syncs FSDP weights into its
  rollout engine through CUDA IPC in 2 GB buckets, i.e. one more pass over 2P bytes at HBM bandwidth. The
  copy is freed after generation (no cost).
* replicated trainer (the runtime; flow_grpo samples in-process with the training module): the training
  copy generates, no switch.
* if the inference copy and the generation activations do not fit next to the resident training state, the
  fp32 master weights and Adam moments are offloaded to host memory over PCIe and reloaded before training
  (UniRL offloads optimizer state this way): 2 x (optimizer bytes per rank) / PCIe bandwidth.
* if even that does not fit, the model cannot be colocated on that GPU.

Per-GPU batch effect: a colocated rank's largest generation batch is what fits next to the state above
(``max_fragment``), and the planner chooses the fragment size under it.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class RankMemory:
    """Bytes on one colocated rank while it generates (``sim.memory``)."""

    params: float        # resident: weights (shard or replica, fp32 master included), VAE, FSDP working set, ...
    optimizer: float     # what can move to host: the AdamW moments (and the EMA)
    reserve: float


@dataclass(frozen=True)
class ColocatedSwitch:
    """How a colocated rank gets from training to generation and back, and what it costs."""

    gather_s: float       # shards -> inference copy
    handoff_s: float      # copy into the inference engine (bucketed IPC)
    offload_s: float      # optimizer state to host and back (0 when it fits)
    offload: bool
    free_for_generation: float   # bytes left for generation activations

    @property
    def seconds(self) -> float:
        return self.gather_s + self.handoff_s + self.offload_s


def colocated_switch(mem: RankMemory, P: float, n: int, sharded: bool, capacity: float, act_one: float,
                     net_bytes_s: float, hbm_bytes_s: float, pcie_bytes_s: float) -> ColocatedSwitch | None:
    """The switch of one colocated step, or None when one generation does not fit even after offloading."""
    n = max(1, n)
    copy = 2.0 * P if sharded else 0.0          # replicated: the training copy generates
    resident = mem.params + mem.optimizer + mem.reserve + copy   # grads are free between commit and training
    gather = 2.0 * P * (n - 1) / n / net_bytes_s if sharded else 0.0
    handoff = 2.0 * P / hbm_bytes_s if sharded else 0.0
    free = capacity - resident
    if free >= act_one:
        return ColocatedSwitch(gather, handoff, 0.0, False, free)
    free += mem.optimizer
    if free < act_one:
        return None
    return ColocatedSwitch(gather, handoff, 2.0 * mem.optimizer / pcie_bytes_s, True, free)
