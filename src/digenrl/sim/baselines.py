"""Colocated baselines as the peers run them, each a named loop with the peer config it models.

Every baseline is a colocated run (every rank samples, then trains) of the scenario's model and workload,
priced by a ``RooflineCost`` (the idealised colocated plan: memory, placement, switch) that a loop wraps:

* ``idealised``: the roofline's own colocated mode: the scenario's training, each rank training one timestep
  x its local batch per forward/backward (the scheduler's colocated layout), every rank busy, the switch priced from bytes and bandwidths (an all-gather into an inference copy and a bucketed
  hand-off on a sharded pool). No peer runs this loop: it is a bound, and it is labelled so.
* ``flow_grpo``: LoRA under DDP (every rank a replica; ``accelerator.accumulate`` all-reduces the fp32 LoRA
  gradients at its sync step, once per optimizer step: the commit), sampling in-process with the training
  module in batches of its ``sample.train_batch_size`` and training ``train.batch_size`` (= the sample batch)
  samples of one timestep per forward/backward::

      denoise(n) = n / b_s x denoise(b_s) x 1.28     train_chunk(c) = c / b_t x train_chunk(b_t)

  with the roofline's packed costs at those batches (``b_t`` capped by the memory's cells). It samples with the
  peft module's adapters unmerged, so every denoising forward pays ``sim.variants.UNMERGED_LORA_SLOWDOWN``
  (1.28: verl-omni issue 248). Only the models flow_grpo has a config for (``FLOW_GRPO``).
* ``dancegrpo``: full fine-tuning under FSDP with fp32 parameters (``--master_weight_type fp32``: FSDP
  MixedPrecision with bf16 compute, fp32 gradient reduction), batch 1 everywhere: it samples one generation
  at a time on the FSDP module (every denoising forward all-gathers the bf16 parameters, no inference copy, no
  switch) and trains one sample x one timestep per forward/backward, each gathering the parameters twice and
  reduce-scattering its fp32 gradients (no ``no_sync``)::

      denoise(n)     = n x (overlapped(compute(1), fps x gather) + overhead)
      train_chunk(c) = c x (overlapped(compute(1 cell), 2 gather + scatter_fp32) + 3 overhead)
      commit         = Adam over the rank's shard (the gradients are already reduced)

  with ``gather = 2P (N - 1) / N / bus`` and ``scatter_fp32 = 4P (N - 1) / N / bus`` over all N ranks
  (``sim.comm``). Its memory is taken from the idealised plan (which holds more: an unsharded bf16 gradient
  and an inference copy), so a DanceGRPO baseline that the plan refuses may in fact fit.

``full``'s ratio to a baseline compares like with like only where both train the same way
(``same_training``): the page (``benchmarks/where_wins.py``) runs ``full`` with LoRA against flow_grpo and
with full fine-tuning against DanceGRPO.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..schedule.cost import TRAINER
from ..models.specs import canonical
from ..recipe_base import SOURCES
from .presets import FULL_SHARDED, Training
from .roofline import RooflineCost
from .variants import UNMERGED_LORA_SLOWDOWN

FLOW_GRPO_SOURCE, DANCEGRPO_SOURCE = SOURCES["flow_grpo"], SOURCES["dancegrpo"]


@dataclass(frozen=True)
class PeerConfig:
    """What a peer's config sets for one model (the values a baseline reads), with where it says so."""

    lora_rank: int          # 0: full fine-tuning
    train_batch: int        # samples (of one timestep) per forward/backward
    sample_batch: int       # generations per sampling forward
    source: str             # file and values in the peer repository


# flow_grpo: config/grpo.py::<config> (sample.train_batch_size per GPU; train.batch_size = sample.train_batch_size)
# and the LoraConfig rank of its training script (values as src/digenrl/recipes.py cites them).
FLOW_GRPO: dict[str, PeerConfig] = {
    "flux": PeerConfig(64, 3, 3, "config/grpo.py::pickscore_flux: sample.train_batch_size = 3, train.batch_size = 3; "
                                 "scripts/train_flux.py: LoraConfig(r=64)"),
    "qwen_image": PeerConfig(64, 4, 4, "config/grpo.py::pickscore_qwenimage: sample.train_batch_size = 4, "
                                       "train.batch_size = 4; scripts/train_qwenimage.py: LoraConfig(r=64)"),
    "sd3": PeerConfig(32, 9, 9, "config/grpo.py::pickscore_sd3: sample.train_batch_size = 9, "
                                        "train.batch_size = 9; scripts/train_sd3.py: LoraConfig(r=32)"),
    "wan": PeerConfig(32, 8, 8, "config/grpo.py::general_ocr_wan2_1: sample.train_batch_size = 8, train.batch_size "
                                "= 8; scripts/train_wan2_1.py: LoraConfig(r=32)"),
}
# DanceGRPO: scripts/finetune/finetune_{flux,hunyuan}_grpo.sh (--train_batch_size 1, --master_weight_type fp32
# default, --gradient_checkpointing) and fastvideo/train_grpo_{flux,hunyuan}.py (FSDP full sharding, one
# sample per sampling and per training forward). DanceGRPO ships no Wan2.1-14B or Qwen-Image script in the
# source read: for those the same loop is priced and labelled as DanceGRPO's loop, not DanceGRPO's config.
DANCEGRPO: dict[str, PeerConfig] = {
    "flux": PeerConfig(0, 1, 1, "fastvideo/train_grpo_flux.py: FSDP(transformer), batch 1; "
                                "finetune_flux_grpo.sh: --train_batch_size 1, --gradient_checkpointing"),
    "hunyuan_video": PeerConfig(0, 1, 1, "fastvideo/train_grpo_hunyuan.py: FSDP(transformer), batch 1; "
                                   "finetune_hunyuan_grpo.sh: --train_batch_size 1, --gradient_checkpointing"),
}
DANCEGRPO_LOOP = PeerConfig(0, 1, 1, "DanceGRPO's loop (batch 1, FSDP, fp32 parameters); DanceGRPO ships no "
                                     "config for this model")


@dataclass(frozen=True)
class Baseline:
    """A named colocated baseline: its key, its label, the training it runs and how it wraps the roofline."""

    name: str
    label: str
    training: Training
    config: PeerConfig | None
    source: str

    def variant(self, base: RooflineCost):
        if self.name == "flow_grpo":
            return FlowGRPOLoop(base, self.config)
        if self.name == "dancegrpo":
            return DanceGRPOLoop(base)
        return base


def idealised(training: Training) -> Baseline:
    return Baseline("idealised", "idealised colocated bound (batched, idle-free, switch priced from bytes; no "
                                 "peer runs this loop)", training, None, "sim/roofline.py colocated mode")


def flow_grpo(model: str) -> Baseline | None:
    """flow_grpo's loop for ``model`` (None: flow_grpo has no config for it)."""
    cfg = FLOW_GRPO.get(canonical(model))
    if cfg is None:
        return None
    return Baseline("flow_grpo", f"flow_grpo (LoRA r{cfg.lora_rank}, DDP, {cfg.train_batch} samples per "
                                 f"forward/backward, sampling batch {cfg.sample_batch})",
                    Training(lora_rank=cfg.lora_rank, sharded=False), cfg, f"{FLOW_GRPO_SOURCE}: {cfg.source}")


def dancegrpo(model: str) -> Baseline:
    """DanceGRPO's loop; labelled as DanceGRPO's config only where DanceGRPO has one for ``model``."""
    cfg = DANCEGRPO.get(canonical(model))
    if cfg is None:
        return Baseline("dancegrpo", "batch-1 FSDP loop as DanceGRPO's (fp32 parameters; no DanceGRPO config "
                                     "for this model)", FULL_SHARDED, DANCEGRPO_LOOP, DANCEGRPO_LOOP.source)
    return Baseline("dancegrpo", "DanceGRPO (full fine-tuning, FSDP with fp32 parameters, batch 1)", FULL_SHARDED,
                    cfg, f"{DANCEGRPO_SOURCE}: {cfg.source}")


def baselines(model: str, training: Training) -> list[Baseline]:
    """The baselines of ``model``: the idealised bound (with the scenario's ``training``), flow_grpo where it
    has a config, DanceGRPO's loop."""
    return [b for b in (idealised(training), flow_grpo(model), dancegrpo(model)) if b is not None]


@dataclass
class FlowGRPOLoop:
    """flow_grpo's loop on a colocated, replicated LoRA roofline (module docstring)."""

    base: RooflineCost
    config: PeerConfig

    def time(self, op: str, batch: int, pool: str) -> float:
        b = self.base
        if op in ("denoise", "vae_decode", "reward"):
            s = self.config.sample_batch
            unmerged = UNMERGED_LORA_SLOWDOWN if op == "denoise" and self.config.lora_rank else 1.0
            return max(1, batch) / s * b.time(op, s, pool) * unmerged
        if op == "train_chunk":
            t = max(1, min(self.config.train_batch, b.max_cells))
            return max(1, batch) / t * b.time(op, t, pool)
        return b.time(op, batch, pool)


@dataclass
class DanceGRPOLoop:
    """DanceGRPO's loop on a colocated, FSDP full fine-tuning roofline (module docstring)."""

    base: RooflineCost

    def time(self, op: str, batch: int, pool: str) -> float:
        b, n = self.base, max(1, batch)
        ov = b.effs[TRAINER].overhead_s
        if op == "denoise":
            one = b.time(op, 1, pool) - ov  # one generation's forwards, no gather (the roofline's inference copy)
            return n * (b._comm(one, b.model.forwards_per_step * b.gather_s) + ov)
        if op in ("vae_decode", "reward"):
            return n * b.time(op, 1, pool)
        if op == "train_chunk":
            comp = b.train_compute(b.train_flops_per_cell(), b.train_fps * b.seq)
            scatter_fp32 = b.fabric.ring_s(4.0 * b.trainable, b.train_slots)
            comm = (2.0 + b.workload.algorithm.old_forwards()) * b.gather_s + scatter_fp32
            return n * (b._comm(comp, comm) + 3 * ov)
        if op == "allreduce":  # reduce-scattered inside every cell's backward: the clip norm's all-reduce is left
            return 1e-3
        if op == "tag_switch":  # samples on the FSDP module: no inference copy to build
            return 0.0
        return b.time(op, batch, pool)


__all__ = ["Baseline", "DANCEGRPO", "DanceGRPOLoop", "FLOW_GRPO", "FlowGRPOLoop", "PeerConfig", "baselines",
           "dancegrpo", "flow_grpo", "idealised"]
