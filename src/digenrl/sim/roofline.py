"""Analytic GPU roofline cost model (implements ``digenrl.schedule.CostModel``).

Forward FLOPs of one sample, ``F``: per-stream parameter counts and attention layers of the diffusers
transformer (``models.flops``): ``F = 2 (P_img n_img + P_txt n_txt + P_joint (n_img + n_txt) + P_sample) + attn``.
An op's time is ``max(compute, memory) + overhead`` with ``compute = FLOPs / (peak * eff(tokens))`` and ``eff``
fitted per GPU kind to public measurements (``sim.efficiency``), ``memory = weight bytes / HBM bandwidth``; the
communication inside an op overlaps its compute but for the exposed share x (``sim.comm.overlapped``:
``x comm + max(compute, (1 - x) comm)``, ``Assumptions.exposed_comm``). Collectives are priced by where their
ranks sit (``sim.comm``: NVLink inside a node, the NICs across nodes; pools packed trainers first).

Training follows ``workload.training`` (``presets.Training``): LoRA or full, sharded (FSDP) or replicated,
activation recomputation, publish path. A chunk of c cells is one packed forward+backward::

    FLOPs = c * train_forwards * (F + (F_linear + k A) [input grads] + F_linear [weight grads, full only]
                                  + F [recomputed forward, with recompute])

with ``A = F - F_linear`` the attention FLOPs and ``k`` the attention backward's factor (2.5: ``sim.assumptions``).
(LoRA's own weight gradients are r/h of the linear FLOPs and left out.) ``train_forwards`` is the model's forwards per
step (2 with CFG), 1 for DiffusionNFT (CFG-free training); the workload's algorithm also sets S, the denoising steps
per sample and the trajectory bytes (``sim.algorithms``).

Sharded trainer pool (``training.sharded``, disaggregated): what the runtime runs (``train.sharding: fsdp``): the
pool is ONE shard group, the scheduler's single trainer, and each of its actions is a collective of the N ranks with
the action's cells or generations split over them (``ceil(c / N)`` per rank). A chunk's forward and backward
all-gather the parameters (2 x 2P (N-1)/N bytes) and its backward reduce-scatters the fp32 gradients (4 x trainable
x (N-1)/N bytes), overlapped with compute but for the exposed share; the commit then only steps the shards. Hybrid
sharding (``training.shard_groups`` = k): k such groups of g = N / k ranks, each a scheduler trainer (parameters,
master weights and Adam moments sharded over g; each group's collectives priced at the bus bandwidth of its own
ranks, the slowest group's); the commit adds the ring all-reduce of the fp32 gradient shards across the k replicas
(the j-th ranks of the groups), 2 (k - 1) / k x 4 x trainable / g bytes.

* commit: gradient sync (shard group: none left, a norm all-reduce; replicated: ring all-reduce of
  2 (N-1)/N x gradient bytes; colocated FSDP baseline: reduce-scatter of 2P (N-1)/N bytes) + Adam over the
  rank's trainable parameters (28 bytes each at HBM bandwidth);
* publish, ``object_store`` (the runtime's default): rank 0 copies the trainable state to host (PCIe), puts it
  in the Ray object store (host copy at ``HOST_COPY_GBS``), every generator node other than rank 0's fetches it
  once (the object transfer leaves the source node one node after another at one NIC's rate), each generator
  loads it over PCIe; ``broadcast``: pipelined link-rate broadcast + load at HBM bandwidth. On a shard group
  both first gather the full state on every rank, as the runtime does (``full_trainable_state``: b (g-1)/g
  bytes over the link); ``stream``: no gather, each of the g ranks of the (first) shard group broadcasts its
  own shard: the trainers' part (pool ``trainer``, charged to the final commit) is that send, b / (g link),
  the generators' part (pool ``generator``, the publish action) the receive of all b bytes at link rate +
  the load, as for the broadcast;
* TAG switch on a trainer rank: replicated trainer: 0 (the training copy generates); shard group: 0 (every
  generation forward gathers the shards, overlapped with compute), or with ``training.tag_copy`` one all-gather
  of the bf16 weights into an inference copy (2P (N-1)/N bytes), after which the ranks' generation forwards
  need no gather; the copy stays for the rest of the run, as the runtime keeps it, so the memory plan holds it
  beside the training state (``inference_copy``: smaller chunks; refused where one generation does not fit);
* colocated (no generator pool): the per-step switch of ``sim.colocation`` (gather + bucketed hand-off,
  optimizer offload over PCIe when memory requires it) is charged on each rank's first generation of a step.

Sequence parallelism (Ulysses; ``training.sequence_parallel`` d of a trainer lane, ``training.
generator_sequence_parallel`` d of a generator): the d ranks of a lane (a shard group of g ranks has g / d lanes;
replicated trainers: one scheduler trainer per d ranks) or of a generator run each forward together, each on its
share of the FLOPs (``models.flops``: 1 / d of the latent tokens, H / d heads) at the efficiency of its n / d tokens.
Every self-attention layer (joint or image; Wan's cross-attention needs none) exchanges the sequence activations 4
times (q, k, v: tokens split -> heads split; the output back), each all-to-all moving (d - 1) / d of a rank's
activation bytes ``B = n_img / d x d_attn x 2`` (bf16) per sample-forward (``sim.comm.all_to_all_s``: NVLink inside a
node, the NIC across nodes)::

    a2a(d) = 4 x L_attn x all_to_all_s(B, the lane's slots)       per sample-forward, exposed (on the attention's path)

a training cell pays it in its forward, its backward (the gradients' all-to-alls) and its recomputed forward.

Memory: the memory plan of ``train.memory`` per trainer and generator rank (``sim.memory``).
"""

from __future__ import annotations

import math

from ..schedule.cost import GENERATOR, TRAINER
from ..train.memory import GiB
from .assumptions import DEFAULT, Assumptions
from .colocation import GB, colocated_switch
from .comm import Fabric, overlapped, pool_slots
from .efficiency import Efficiency, efficiency_for
from .memory import PoolMemory, preset_inputs
from .planner import Infeasible as InfeasibleError  # the model does not fit the pool's GPUs under this split
from .presets import GPU, ModelPreset, Testbed, Workload, tokens_per_sample

HOST_COPY_GBS = 10.0     # host memcpy into the object store's shared memory (assumed, single stream)

__all__ = ["Efficiency", "InfeasibleError", "RooflineCost"]


class RooflineCost:
    """Roofline costs of ``model`` on ``testbed`` with ``n_gen`` generators and ``n_train`` trainer ranks.

    ``colocated``: there is no generator pool; the ``n_train`` ranks generate and train. ``gen_gpu`` /
    ``train_gpu`` choose the GPU kind of each pool (default: the testbed's first kind for generators, its
    second kind, if any, for trainers). ``assume``: the named assumptions (exposed communication share, attention
    backward factor; ``sim.assumptions``).
    """

    def __init__(self, model: ModelPreset, workload: Workload, testbed: Testbed, n_gen: int, n_train: int,
                 colocated: bool = False, gen_gpu: GPU | None = None, train_gpu: GPU | None = None,
                 assume: Assumptions = DEFAULT):
        self.model, self.workload, self.testbed = model, workload, testbed
        self.assume = assume
        self.n_gen, self.n_train, self.colocated = n_gen, n_train, colocated
        self.training = workload.training
        train_gpu = train_gpu or testbed.gpu2 or testbed.gpu
        self.gpu = {GENERATOR: gen_gpu or testbed.gpu, TRAINER: train_gpu}
        if colocated:
            self.gpu[GENERATOR] = train_gpu
        self.effs = {p: efficiency_for(g) for p, g in self.gpu.items()}
        self.eff = self.effs[TRAINER]
        m, arch = model, model.archi
        self.params = float(arch.params)
        self.lora = self.training.lora_rank > 0
        self.trainable = float(arch.lora_params(self.training.lora_rank)) if self.lora else self.params
        self.latent_tokens, self.latent_frames = tokens_per_sample(m, workload)
        n_txt = m.text_tokens
        self.seq = self.latent_tokens + (n_txt if m.joint_text else 0)
        self.fwd_flops = arch.forward_flops(self.latent_tokens, n_txt)
        self.fwd_linear = arch.linear_flops(self.latent_tokens, n_txt)
        t = self.training
        self.sp = {TRAINER: t.sequence_parallel, GENERATOR: t.sequence_parallel if colocated else
                   t.generator_sequence_parallel}
        self.fabric = Fabric(testbed)
        self.gen_slots, self.train_slots = pool_slots(self.fabric, self.gpu[GENERATOR], n_gen, train_gpu,
                                                      max(1, n_train), colocated)
        self.sharded = self.training.sharded
        self.grouped = self.sharded and not colocated  # the runtime's shard group(s): one scheduler trainer each
        self.groups = self.training.shard_groups if self.grouped else 1  # hybrid sharding: k replica groups
        if max(1, n_train) % self.groups:
            raise InfeasibleError(f"{n_train} trainer ranks do not split into {self.groups} shard groups")
        n = self.group_ranks = max(1, n_train) // self.groups  # the ranks one shard group shards over
        if n % self.sp[TRAINER] or (not colocated and n_gen % self.sp[GENERATOR]):
            raise InfeasibleError(f"sequence parallel: degree {self.sp[TRAINER]} does not divide {n} trainer ranks "
                                  f"or {self.sp[GENERATOR]} does not divide {n_gen} generator GPUs")
        self.lanes = n // self.sp[TRAINER] if self.grouped else 1  # data-parallel lanes of a scheduler trainer
        self.gather_s = self._group_ring(2.0 * self.params) if self.sharded else 0.0
        self.scatter_s = self._group_ring(4.0 * self.trainable) if self.grouped else 0.0
        self.train_fps = workload.algorithm.train_forwards(m.forwards_per_step)  # DiffusionNFT trains CFG-free
        self.tag_copy = self.grouped and self.training.tag_copy
        self.memory = PoolMemory.of(preset_inputs(m, workload, self.training, self.eff.reserve_gb), ranks=n,
                                    sharded=self.sharded, sequence=self.sp[TRAINER], train_forwards=self.train_fps,
                                    sample_forwards=m.forwards_per_step, generator_sequence=self.sp[GENERATOR],
                                    train_gb=train_gpu.memory_gb, gen_gb=self.gpu[GENERATOR].memory_gb,
                                    inference_copy=self.tag_copy and n > 1)  # (built once, kept: the runtime's)
        self.act_cell = self.memory.plan.act_cell   # bytes of one cell's activations on a trainer rank
        self.act_infer = self.memory.generation_bytes(1)  # of one trajectory's sampling
        self.switch = None
        if colocated:
            g = self.gpu[TRAINER]
            self.switch = colocated_switch(self.memory.colocated(), self.params, n, self.sharded,
                                           self.memory.train_capacity, self.act_infer,
                                           self.fabric.bus_bytes_s(self.train_slots), g.hbm_gbs * GB, g.pcie_gbs * GB)
        self._check_memory()
        if self.tag_copy and not self.inference_copy_fits:
            raise InfeasibleError(f"{model.name}: no room for a bf16 inference copy beside the training state on "
                                  f"{n_train} {self.gpu[TRAINER].name} ranks (training.tag_copy)")

    # ---- placement ---------------------------------------------------------------------------------
    def group_slots(self, j: int) -> list[int]:
        """The slots of shard group ``j`` (consecutive ranks of the trainer pool); the whole pool unsharded."""
        g = self.group_ranks
        return self.train_slots[j * g:(j + 1) * g] if self.grouped else self.train_slots

    def _group_ring(self, nbytes: float) -> float:
        """All-gather / reduce-scatter of ``nbytes`` inside each shard group: the slowest group's time."""
        return max(self.fabric.ring_s(nbytes, self.group_slots(j)) for j in range(self.groups))

    def _comm(self, compute_s: float, comm_s: float) -> float:
        """Compute overlapped with communication but for the exposed share (``sim.comm.overlapped``)."""
        return overlapped(compute_s, comm_s, self.assume.exposed_comm)

    # ---- memory ------------------------------------------------------------------------------------
    @property
    def max_cells(self) -> int:
        """Largest chunk (cells) whose activations fit next to the training state (per rank)."""
        return self.memory.max_cells

    @property
    def max_chunk(self) -> int:
        """Largest chunk of the scheduler's trainer: a shard group's N / d lanes train ``max_cells`` each."""
        return self.max_cells * self.lanes

    def _share(self, n: int, pool: str) -> int:
        """Items of an action of ``n`` one lane handles: ceil(n / lanes) on a shard group (N / d lanes of d
        sequence-parallel ranks), else n."""
        return math.ceil(n / self.lanes) if self.grouped and pool == TRAINER else n

    # ---- sequence parallelism ----------------------------------------------------------------------
    def a2a_s(self, pool: str) -> float:
        """The all-to-alls of one sample-forward under sequence parallelism (module docstring) among the first
        group's d consecutive slots, each rank holding n_img / d tokens x d_attn x 2 bytes (bf16); 0 at d = 1."""
        d = self.sp[pool]
        if d == 1:
            return 0.0
        slots = (self.train_slots if pool == TRAINER or self.colocated else self.gen_slots)[:d]
        nbytes = self.latent_tokens / d * self.model.archi.d_attn * 2.0
        return 4 * self.model.layers * self.fabric.all_to_all_s(nbytes, slots)

    def fwd_share(self, pool: str) -> tuple[float, float]:
        """(forward FLOPs, linear FLOPs) of one rank's share of one sample-forward (``models.flops``)."""
        d, arch, n_txt = self.sp[pool], self.model.archi, self.model.text_tokens
        if d == 1:
            return self.fwd_flops, self.fwd_linear
        return arch.forward_flops(self.latent_tokens, n_txt, d), arch.linear_flops(self.latent_tokens, n_txt, d)

    @property
    def inference_copy_fits(self) -> bool:
        """Sharded trainer: room for a bf16 inference copy + one generation next to the training state (the
        copy is in the state where the rank keeps one: ``training.tag_copy``)."""
        free = self.memory.train_capacity - self.memory.plan.state
        kept = "inference_copy" in self.memory.plan.items
        return not self.sharded or free >= (0.0 if kept else 2.0 * self.params) + self.act_infer

    @property
    def max_fragment(self) -> int:
        """Largest generator batch (generations) that fits: next to a bf16 replica on a generator, next to the
        (possibly offloaded) training state on a colocated rank."""
        if self.colocated:
            return max(1, int(self.switch.free_for_generation // self.act_infer)) if self.switch else 0
        return self.memory.max_fragment

    def _check_memory(self) -> None:
        t = self.gpu[TRAINER]
        if self.max_cells < 1:
            need = self.memory.plan.total(1) / GiB
            groups = f" in {self.groups} shard groups of {self.group_ranks}" if self.groups > 1 else ""
            copy = self.memory.plan.items.get("inference_copy", 0.0) / GiB
            kept = f", {copy:.0f} GiB of it the TAG inference copy (training.tag_copy)" if copy else ""
            raise InfeasibleError(f"{self.model.name} training needs {need:.0f} GiB per rank with "
                                  f"{self.n_train} {t.name} trainer ranks{groups} (capacity {t.memory_gb:.0f} GiB"
                                  f"{kept})")
        if self.colocated and self.switch is None:
            raise InfeasibleError(f"{self.model.name} cannot generate next to its training state on "
                                  f"{t.name} even with the optimizer offloaded")
        if not self.colocated and self.max_fragment < 1:
            g = self.gpu[GENERATOR]
            raise InfeasibleError(f"{self.model.name} bf16 replica and one trajectory's sampling do not fit a {g.name} "
                                  "generator")

    # ---- CostModel ---------------------------------------------------------------------------------
    def time(self, op: str, batch: int, pool: str) -> float:
        fn = getattr(self, "_" + op, None)
        if fn is None:
            raise KeyError(f"roofline: unknown op {op!r}")
        return fn(max(1, batch), pool)

    def _compute(self, flops: float, tokens: float, pool: str) -> float:
        return flops / (self.gpu[pool].bf16_tflops * 1e12 * self.effs[pool](tokens))

    def train_compute(self, flops: float, tokens: float) -> float:
        """A training forward/backward's compute: at the trainer's fitted efficiency times
        ``Assumptions.train_efficiency``."""
        return self._compute(flops, tokens, TRAINER) / self.assume.train_efficiency

    def _denoise(self, n: int, pool: str) -> float:
        gpu, m = self.gpu[pool], self.model
        fwd = self._share(n, pool) * m.forwards_per_step
        d = self.sp[pool]
        t = max(self._compute(fwd * self.fwd_share(pool)[0], fwd * self.seq / d, pool),
                2.0 * self.params / (gpu.hbm_gbs * GB))
        if pool == TRAINER and self.grouped and not self.tag_copy:
            t = self._comm(t, self.gather_s)  # FSDP forward of the shard group: shards gathered on the fly
        return t + fwd * self.a2a_s(pool) + self.effs[pool].overhead_s

    def _conv(self, flops: float, pool: str) -> float:
        """VAE and reward FLOPs at the efficiency's ``conv_fraction`` of peak, plus the launch overhead."""
        return flops / (self.gpu[pool].bf16_tflops * 1e12 * self.effs[pool].conv_fraction) + self.effs[pool].overhead_s

    def _vae_decode(self, n: int, pool: str) -> float:
        w = self.workload
        px = w.width * w.height * (w.frames if self.model.video else 1)
        return self._conv(self._share(n, pool) * self.model.spec.vae_flop_per_px * px, pool)

    def _reward(self, n: int, pool: str) -> float:
        return self._conv(self._share(n, pool) * self.model.reward_tflop * 1e12, pool)

    def trajectory_bytes(self) -> float:
        """What the trainers receive of one trajectory (``sim.algorithms``: the trained transitions' input and
        output latents and their fp32 log-probs, GRPO-Guard's means, DiffusionNFT's x_0 alone) plus the cached
        prompt embedding, bf16."""
        m, w = self.model, self.workload
        latent = m.spec.latent_elements(w.height, w.width, w.frames)
        latents, scalars = w.algorithm.moved_latents(w.trained_timesteps)
        return latents * latent * 2 + scalars * 4 + m.text_tokens * m.spec.text_dim * 2

    def _transfer(self, n: int, pool: str) -> float:
        if self.colocated:  # the colocated baseline (flow_grpo, VeRL-Omni) keeps trajectories in process
            return 0.0
        return n * self.trajectory_bytes() / self.fabric.p2p_bytes_s(self.gen_slots, self.train_slots) + 1e-3

    def train_flops_per_cell(self) -> float:
        """Forward (L + A) + input gradients (L + k A) + weight gradients (L, full fine-tuning) + recomputed
        forward (L + A, with recomputation), times the training forwards per cell (module docstring)."""
        fwd, lin = self.fwd_share(TRAINER)  # one rank's share under sequence parallelism
        attn = fwd - lin
        per = fwd + lin + self.assume.attn_backward * attn + (0.0 if self.lora else lin)
        per += fwd if self.training.recompute else 0.0
        per += fwd * self.workload.algorithm.old_forwards()  # DiffusionNFT's soft old policy: v_old
        return per * self.train_fps

    def train_a2a_s(self) -> float:
        """A training cell's all-to-alls: forward, backward and (with recomputation) the recomputed forward, per
        training forward (module docstring)."""
        passes = 2 + (1 if self.training.recompute else 0) + self.workload.algorithm.old_forwards()
        return passes * self.train_fps * self.a2a_s(TRAINER)

    def _train_chunk(self, c: int, pool: str) -> float:
        c = self._share(max(1, math.ceil(c * self.workload.trained_share - 1e-9)), TRAINER)  # the cells that run
        fwd = c * self.train_fps
        comp = self.train_compute(c * self.train_flops_per_cell(), fwd * self.seq / self.sp[TRAINER])
        alg = self.workload.algorithm  # (+ DiffusionNFT's soft old policy: its forward's gather, the exchanges)
        return (self._comm(comp, (2.0 + alg.old_forwards()) * self.gather_s + self.scatter_s) + 3 * self.eff.overhead_s
                + c * self.train_a2a_s()
                + alg.chunk_copy_bytes() * self._local_trainable() / (self.gpu[TRAINER].hbm_gbs * GB))

    def grad_bytes(self) -> float:
        return (4.0 if self.lora else 2.0) * self.trainable

    def _allreduce(self, _: int, pool: str) -> float:
        if self.grouped:  # reduce-scattered inside every chunk's backward; the clip norm's all-reduce is left,
            g = self.group_ranks  # and with k shard groups the ring all-reduce of the fp32 gradient shards across
            replicas = [self.train_slots[j::g] for j in range(g)]  # them: rank j of every group
            return max(self.fabric.allreduce_s(4.0 * self.trainable / g, r) for r in replicas) + 1e-3
        if self.sharded and not self.lora:  # the colocated FSDP baseline: one reduce-scatter at the commit
            return self.fabric.ring_s(self.grad_bytes(), self.train_slots) + 1e-3
        return self.fabric.allreduce_s(self.grad_bytes(), self.train_slots) + 1e-3  # replicas: ring all-reduce

    def _local_trainable(self) -> float:
        """Trainable parameters of one trainer rank (its shard of them under FSDP without LoRA)."""
        return self.trainable / self.group_ranks if self.sharded and not self.lora else self.trainable

    def _optimizer(self, _: int, pool: str) -> float:
        per = 28.0 + self.workload.algorithm.commit_copy_bytes()  # Adam (+ DiffusionNFT's soft old update)
        return per * self._local_trainable() / (self.gpu[TRAINER].hbm_gbs * GB) + 1e-3

    def publish_bytes(self) -> float:
        return 2.0 * self.trainable

    def _publish(self, _: int, pool: str) -> float:
        b, g, t = self.publish_bytes(), self.gpu[GENERATOR], self.gpu[TRAINER]
        n = self.group_ranks if self.grouped else 1
        senders = self.group_slots(0)[:n]
        link = self.fabric.p2p_bytes_s(senders, self.gen_slots)  # trainers -> generators
        if self.training.publish == "stream":
            if pool == TRAINER:  # the sending ranks' part: each sends its shard, beside its work
                return b / n / link + 1e-3
            return b / link + b / (g.hbm_gbs * GB) + 0.01
        gather = self.fabric.ring_s(b, senders)  # the shard group gathers the full state first (0 unsharded)
        if self.training.publish == "broadcast":
            return gather + b / link + b / (g.hbm_gbs * GB) + 0.01
        # the object leaves rank 0's node once per other generator node (one on the same node reads shared memory)
        nodes = len(self.fabric.nodes(self.gen_slots) - self.fabric.nodes(senders[:1]))
        return (gather + b / (t.pcie_gbs * GB) + b / (HOST_COPY_GBS * GB) + nodes * b / self.testbed.net_bytes_s
                + b / (g.pcie_gbs * GB) + 0.01)

    def _tag_switch(self, _: int, pool: str) -> float:
        if self.colocated:
            return self.switch.seconds
        if self.tag_copy:  # one all-gather of the bf16 weights into the inference copy
            return self.gather_s
        return 0.0  # replicated: the training copy generates; shard group: gathered per forward (in denoise)

    # ---- reporting ---------------------------------------------------------------------------------
    def describe(self) -> dict[str, float]:
        """Key derived numbers (for docs and sanity checks)."""
        w = self.workload
        gen_pool = TRAINER if self.colocated else GENERATOR
        out = {
            "seq_tokens": self.seq,
            "fwd_tflop": self.fwd_flops / 1e12,
            "naive_fwd_tflop": (2.0 * self.params * self.seq + self.model.archi.attention_flops(
                self.latent_tokens, self.model.text_tokens)) / 1e12,
            "gen_s_per_sample": w.denoise_steps * self._denoise(1, gen_pool) + self._vae_decode(1, gen_pool)
            + self._reward(1, gen_pool),
            # per rank: a shard group's chunk of k x N cells gives each of its N ranks k cells
            "train_s_per_cell": self._train_chunk(self.lanes, TRAINER),
            "train_s_per_cell_at_8": (self._train_chunk(8 * self.lanes, TRAINER) / 8 if self.max_cells >= 8
                                      else float("nan")),
            "train_eff_1cell": self.effs[TRAINER](self.train_fps * self.seq) / self.eff.plateau,
            "max_cells": self.max_cells,
            "inference_copy_fits": float(self.inference_copy_fits),
            "commit_s": self._allreduce(1, TRAINER) + self._optimizer(1, TRAINER),
            "publish_path": self.training.publish,
            # the publish action (it holds the generators of a stream, the trainers otherwise) and what the
            # trainers pay (a stream: their sends, in the final commit)
            "publish_s": self._publish(1, GENERATOR if self.training.publish == "stream" else TRAINER),
            "publish_trainer_s": self._publish(1, TRAINER),
            "publish_gb": self.publish_bytes() / GB,
            "tag_switch_s": self._tag_switch(1, TRAINER),
            "fsdp_gather_s": self.gather_s,
            "fsdp_scatter_s": self.scatter_s,
            "train_compute_s_per_cell": self.train_compute(self.train_flops_per_cell(), self.train_fps * self.seq),
            "plateau_gen": self.effs[gen_pool].plateau,
            "plateau_train": self.effs[TRAINER].plateau,
        }
        if self.switch is not None:
            out.update({"coloc_gather_s": self.switch.gather_s, "coloc_handoff_s": self.switch.handoff_s,
                        "coloc_offload_s": self.switch.offload_s, "coloc_offload": float(self.switch.offload),
                        "coloc_max_batch": float(self.max_fragment)})
        return out
