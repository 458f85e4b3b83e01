"""Analytic GPU roofline cost model (implements ``digenrl.schedule.CostModel``).

Per transformer forward of one sample with ``seq`` tokens (latent tokens, plus text tokens for MM-DiTs)::

    F_fwd = 2 * params * seq + 4 * layers * seq^2 * hidden        (linear layers + QK^T and AV)
          [+ 4 * layers * seq * text_tokens * hidden  for cross-attention models]

An op's time is ``max(compute, memory, overlapped communication) + overhead`` with
``compute = FLOPs / (peak * eff(tokens))``, ``eff(x) = plateau * x / (x + half_tokens)`` (achievable share of
the dense peak grows with the tokens in one forward), ``memory = weight bytes / HBM bandwidth``.

Training (trainer pool of N ranks): full-parameter fine-tuning, ZeRO-3/FSDP full sharding, activation
checkpointing, gradients accumulated unsharded under ``no_sync`` until the commit:

* a chunk of c cells is one packed forward+backward: FLOPs = 4 * F_fwd * c * forwards_per_step (forward,
  recomputed forward, backward = 2 forwards); two parameter all-gathers of 2*params*(N-1)/N bytes (forward,
  backward) overlap with compute;
* commit = reduce-scatter of the bf16 gradients (2*params*(N-1)/N bytes) + Adam over the local shard
  (~28 bytes per parameter read+written: fp32 master, m, v, bf16 grad and param) at HBM bandwidth;
* publish = every generator receives 2*params bytes at its link rate (pipelined broadcast) and loads them;
* TAG / colocated generation on a trainer rank: if an inference copy fits next to the training state, the
  switch gathers it once (2*params*(N-1)/N bytes) and generation runs like a generator; otherwise every
  forward gathers the shards on the fly (FSDP forward, overlapped with compute) and the switch is free.

Memory per trainer rank: 14*params/N (bf16 param, fp32 master, Adam m and v shards) + 2*params (unsharded
bf16 gradient accumulation: FSDP ``no_sync`` keeps full gradients) + reserve + c * A_cell with
A_cell = (2*layers + 34) * seq * hidden * forwards_per_step bytes (checkpointed layer inputs + one layer's
working set, 34 * seq * hidden bytes per layer for 16-bit activations with flash attention; Korthikanti et
al. 2022). Generators hold a bf16 replica (2*params) + reserve (prompt embeddings are cached, so no text
encoder is resident).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..schedule.cost import GENERATOR, TRAINER
from .presets import GPU, ModelPreset, Testbed, Workload, tokens_per_sample

GB = 1e9


class InfeasibleError(ValueError):
    """The model does not fit the pool's GPUs under this split."""


@dataclass(frozen=True)
class Efficiency:
    plateau: float = 0.6          # large-batch transformer passes reach ~40-60 % of dense peak end to end
    half_tokens: float = 512.0    # tokens per forward where half the plateau is reached
    conv_fraction: float = 0.35   # VAE convolutions and reward models
    overhead_s: float = 0.003     # per forward: kernel launches, host sync
    reserve_gb: float = 3.0       # CUDA context, allocator fragmentation, VAE / reward weights

    def __call__(self, tokens: float) -> float:
        return self.plateau * tokens / (tokens + self.half_tokens)


class RooflineCost:
    """Roofline costs of ``model`` on ``testbed`` with ``n_gen`` generators and ``n_train`` trainer ranks.

    ``colocated``: there is no generator pool; the ``n_train`` ranks generate and train. ``gen_gpu`` /
    ``train_gpu`` choose the GPU kind of each pool (default: the testbed's first kind for generators, its
    second kind, if any, for trainers).
    """

    def __init__(self, model: ModelPreset, workload: Workload, testbed: Testbed, n_gen: int, n_train: int,
                 colocated: bool = False, eff: Efficiency | None = None, gen_gpu: GPU | None = None,
                 train_gpu: GPU | None = None):
        self.model, self.workload, self.testbed = model, workload, testbed
        self.n_gen, self.n_train, self.colocated = n_gen, n_train, colocated
        self.eff = eff or Efficiency()
        train_gpu = train_gpu or testbed.gpu2 or testbed.gpu
        self.gpu = {GENERATOR: gen_gpu or testbed.gpu, TRAINER: train_gpu}
        if colocated:
            self.gpu[GENERATOR] = train_gpu
        m, w = model, workload
        self.params = m.params_b * 1e9
        self.latent_tokens, self.latent_frames = tokens_per_sample(m, w)
        self.seq = self.latent_tokens + (m.text_tokens if m.joint_text else 0)
        attn = 4.0 * m.layers * self.seq ** 2 * m.hidden
        cross = 0.0 if m.joint_text else 4.0 * m.layers * self.latent_tokens * m.text_tokens * m.hidden
        self.fwd_flops = 2.0 * self.params * self.seq + attn + cross
        self.net = testbed.net_bytes_s
        n = max(1, n_train)
        self.gather_s = 2.0 * self.params * (n - 1) / n / self.net
        self.act_cell = (2 * m.layers + 34) * self.seq * m.hidden * m.forwards_per_step
        self.act_infer = 34 * self.seq * m.hidden * m.forwards_per_step
        self._check_memory()

    # ---- memory ------------------------------------------------------------------------------------
    def trainer_state_bytes(self) -> float:
        return 14.0 * self.params / max(1, self.n_train) + 2.0 * self.params + self.eff.reserve_gb * GB

    @property
    def max_cells(self) -> int:
        """Largest chunk (cells) whose activations fit next to the training state."""
        free = self.gpu[TRAINER].memory_gb * GB - self.trainer_state_bytes()
        return int(free // self.act_cell)

    @property
    def inference_copy_fits(self) -> bool:
        free = self.gpu[TRAINER].memory_gb * GB - self.trainer_state_bytes()
        return free >= 2.0 * self.params + self.act_infer

    @property
    def max_fragment(self) -> int:
        """Largest generator batch (generations) that fits next to a bf16 replica."""
        if self.colocated:
            return 10 ** 6
        free = self.gpu[GENERATOR].memory_gb * GB - 2.0 * self.params - self.eff.reserve_gb * GB
        return int(free // self.act_infer)

    def _check_memory(self) -> None:
        t = self.gpu[TRAINER]
        if self.max_cells < 1:
            need = (self.trainer_state_bytes() + self.act_cell) / GB
            raise InfeasibleError(f"{self.model.name} training needs {need:.0f} GB per rank with "
                                  f"{self.n_train} {t.name} trainer ranks (capacity {t.memory_gb:.0f} GB)")
        if not self.colocated and self.max_fragment < 1:
            g = self.gpu[GENERATOR]
            raise InfeasibleError(f"{self.model.name} bf16 replica does not fit a {g.name} generator")

    # ---- CostModel ---------------------------------------------------------------------------------
    def time(self, op: str, batch: int, pool: str) -> float:
        fn = getattr(self, "_" + op, None)
        if fn is None:
            raise KeyError(f"roofline: unknown op {op!r}")
        return fn(max(1, batch), pool)

    def _compute(self, flops: float, tokens: float, gpu: GPU) -> float:
        return flops / (gpu.bf16_tflops * 1e12 * self.eff(tokens))

    def _denoise(self, n: int, pool: str) -> float:
        gpu, m = self.gpu[pool], self.model
        fwd = n * m.forwards_per_step
        t = max(self._compute(fwd * self.fwd_flops, fwd * self.seq, gpu),
                2.0 * self.params / (gpu.hbm_gbs * GB))
        if pool == TRAINER and not self.inference_copy_fits:
            t = max(t, self.gather_s)  # FSDP forward: shards gathered on the fly, overlapped
        return t + self.eff.overhead_s

    def _vae_decode(self, n: int, pool: str) -> float:
        w = self.workload
        mpx = w.width * w.height / 1e6 * (w.frames if self.model.video else 1)
        flops = n * self.model.vae_gflop_per_mpx * 1e9 * mpx
        return flops / (self.gpu[pool].bf16_tflops * 1e12 * self.eff.conv_fraction) + self.eff.overhead_s

    def _reward(self, n: int, pool: str) -> float:
        flops = n * self.model.reward_tflop * 1e12
        return flops / (self.gpu[pool].bf16_tflops * 1e12 * self.eff.conv_fraction) + self.eff.overhead_s

    def trajectory_bytes(self) -> float:
        """Latents of every sampling step, per-step log-probs, cached prompt embeddings (bf16)."""
        m, w = self.model, self.workload
        latent = m.latent_channels * self.latent_frames * (w.height // m.spatial_down) * (w.width // m.spatial_down)
        return (w.sampling_steps + 1) * latent * 2 + w.sampling_steps * 4 + m.text_tokens * m.text_dim * 2

    def _transfer(self, n: int, pool: str) -> float:
        return n * self.trajectory_bytes() / self.net + 1e-3

    def _train_chunk(self, c: int, pool: str) -> float:
        m = self.model
        fwd = c * m.forwards_per_step
        comp = self._compute(4.0 * fwd * self.fwd_flops, fwd * self.seq, self.gpu[TRAINER])
        return max(comp, 2.0 * self.gather_s) + 3 * self.eff.overhead_s

    def _allreduce(self, _: int, pool: str) -> float:
        n = max(1, self.n_train)
        return 2.0 * self.params * (n - 1) / n / self.net + 1e-3

    def _optimizer(self, _: int, pool: str) -> float:
        return 28.0 * self.params / max(1, self.n_train) / (self.gpu[TRAINER].hbm_gbs * GB) + 1e-3

    def _publish(self, _: int, pool: str) -> float:
        return 2.0 * self.params / self.net + 2.0 * self.params / (self.gpu[GENERATOR].hbm_gbs * GB) + 0.01

    def _tag_switch(self, _: int, pool: str) -> float:
        return self.gather_s if self.inference_copy_fits else 0.0

    # ---- reporting ---------------------------------------------------------------------------------
    def describe(self) -> dict[str, float]:
        """Key derived numbers (for docs and sanity checks)."""
        w = self.workload
        gen_pool = TRAINER if self.colocated else GENERATOR
        return {
            "seq_tokens": self.seq,
            "fwd_tflop": self.fwd_flops / 1e12,
            "gen_s_per_sample": w.sampling_steps * self._denoise(1, gen_pool) + self._vae_decode(1, gen_pool)
            + self._reward(1, gen_pool),
            "train_s_per_cell": self._train_chunk(1, TRAINER),
            "max_cells": self.max_cells,
            "inference_copy_fits": float(self.inference_copy_fits),
            "commit_s": self._allreduce(1, TRAINER) + self._optimizer(1, TRAINER),
            "publish_s": self._publish(1, TRAINER),
        }
