"""``TrainerWorker``: one rank of the trainer pool (a Ray actor), also a colocated worker.

State: the policy, optimizer, reference policy, EMA (rank 0) and the step's ``GradientTransaction``
(``train.context.build_context``). The ranks form one torch.distributed group; the transaction's commit is the
only gradient sync.

Calls:

* ``train(chunk, [fragment refs of its group], global_std)``: fetch the group's fragments (cached per group),
  compute its advantages (deterministic: every rank gets the same), record the chunk's cells in the step's
  transaction (a cell trained twice or foreign to the step is refused: I2) and accumulate the gradient of
  ``train_cells`` with loss scale 1 / (B * S). The transaction opens at the rank's first chunk of the step.
* ``generate(fragment, version)``: TAG (or colocated generation) with the rank's own weights, which must be
  ``version`` (= the committed version: on-policy, I3). Sampling runs under no_grad: it never touches the
  accumulated gradients or the optimizer.
* ``commit(step)``: all-reduce (SUM) + clip + optimizer step on every rank at once (a collective), EMA on
  rank 0; ``abort()`` drops an open transaction (no partial step is ever committed).
* ``publish(version)``: rank 0's half of a weight publish (``publish`` module).
* ``evaluate`` / ``checkpoint_bytes``: eval reward and checkpoint of the (EMA) weights, on rank 0.
"""

from __future__ import annotations

import time

from .messages import ChunkResult, CommitResult, TimedResult
from .publish import broadcast_send, init_groups, state_copy
from .worker_base import WorkerBase


class TrainerWorker(WorkerBase):
    pool = "trainer"

    def __init__(self, name: str, config: dict, rank: int, failure=None):
        super().__init__(name, config, failure)
        from digenrl.train.context import build_context

        self.rank = rank
        self.ctx = build_context(self.cfg)
        if rank != 0 and self.cfg.train.sharding == "none":
            self.ctx.ema = None  # only rank 0 evaluates and saves (under FSDP every rank holds its EMA shard)
        self.task, self.reward, self.sampler = self.ctx.task, self.ctx.reward, self.ctx.sampler
        self.tx = self.ctx.transaction
        self._groups: dict[tuple[int, int], object] = {}
        self._publish_group = None
        self._world = 1

    @property
    def policy(self):
        return self.ctx.policy

    def setup_dist(self, setup) -> bool:
        """Join the process group(s); then every rank starts from rank 0's weights (as DDP does)."""
        import torch.distributed as dist

        trainer_group, self._publish_group = init_groups(setup)
        self.tx.process_group = trainer_group
        self._world = len(setup.trainer_ranks)
        if self.cfg.train.sharding == "fsdp":  # every rank built the same weights (same seed / checkpoint)
            from digenrl.train.sharding import shard_context

            shard_context(self.ctx, trainer_group)
            self.tx = self.ctx.transaction
        elif self._world > 1:
            for p in self.policy.parameters():
                dist.broadcast(p.data, src=0, group=trainer_group)
        return True

    # ---- training ------------------------------------------------------------------------------------
    def _group(self, step: int, group: int, refs: list, global_std: float | None):
        key = (step, group)
        g = self._groups.get(key)
        if g is None:
            import ray

            from digenrl.rollout.records import TrajectoryBatch
            from digenrl.train.step_work import assign_advantages

            g = TrajectoryBatch.cat(ray.get(list(refs)))
            bad = sorted({int(v) for v in g.version.tolist()} - {step, step - 1})
            if bad or sorted(g.gen_index.tolist()) != list(range(self.cfg.train.generations)):
                raise RuntimeError(f"{self.name}: group {group} of step {step} has generations "
                                   f"{g.gen_index.tolist()} and versions {g.version.tolist()} (I4: staleness <= 1)")
            t = self.cfg.train
            assign_advantages(g, std_mode=t.std_mode, adv_clip_max=t.adv_clip_max, global_std=global_std)
            self._groups[key] = g
        return g

    def train(self, chunk, refs: list, global_std: float | None = None) -> ChunkResult:
        from digenrl.train.chunk_loss import train_cells
        from digenrl.train.step_work import expected_cells

        self.check_failure(chunk.step)
        t0 = time.time()
        if self.tx.version != chunk.step:
            raise RuntimeError(f"{self.name}: chunk of step {chunk.step} but the weights are version "
                               f"{self.tx.version}")
        t = self.cfg.train
        if not self.tx.open:
            S = len(self.ctx.plan(chunk.step).trained)
            self.tx.begin(chunk.step, expected_cells(self.prompts(chunk.step), t.generations, S))
        group = self._group(chunk.step, chunk.group, refs, global_std)
        uid = group.prompts[0].uid
        cells = tuple((uid, g, j) for g, j in chunk.cells)
        self.tx.record(cells)
        B, S = t.prompts_per_step * t.generations, group.latents.shape[1]
        mine, weight = list(chunk.cells), 1.0
        if t.sharding == "fsdp":  # a collective: every rank gets this chunk and trains its share of the cells
            from digenrl.train.sharding import rank_cells

            mine, weight = rank_cells(chunk.cells, self.rank, self._world)
        stats = train_cells(self.policy, group, mine, settings=self.ctx.loss, loss_scale=weight / (B * S),
                            ref_policy=self.ctx.ref_policy)
        return ChunkResult(chunk, self.name, cells, stats, t0, time.time())

    def generate(self, fragment, version: int):
        self.check_failure(fragment.step)
        if version != self.tx.version:
            raise RuntimeError(f"{self.name}: asked to generate {fragment} with version {version} but its weights "
                               f"are version {self.tx.version} (TAG is on-policy only)")
        return self.generate_fragment(self.policy, fragment, version)

    def commit(self, step: int) -> CommitResult:
        self.check_failure(step)
        t0 = time.time()
        if not self.tx.open:  # a rank without a chunk this step still joins the all-reduce
            self.tx.begin(step, None)
        if self.tx.step != step:
            raise RuntimeError(f"{self.name}: commit of step {step} but the open transaction is step {self.tx.step}")
        out = self.tx.commit(check_complete=self._world == 1)
        if self.ctx.ema is not None:
            self.ctx.ema.update()
        for key in [k for k in self._groups if k[0] <= step]:
            del self._groups[key]
        return CommitResult(step, self.name, self.tx.version, out["grad_norm"], t0, time.time())

    def abort(self) -> int | None:
        """Drop the open transaction (if any); returns the step it belonged to."""
        step = self.tx.step
        self.tx.abort()
        self._groups.clear()
        return step

    # ---- publishing, eval, checkpoints -----------------------------------------------------------------
    def publish(self, version: int):
        """(state, TimedResult): the object-store payload of ``version`` (rank 0)."""
        t0 = time.time()
        if version != self.tx.version:
            raise RuntimeError(f"{self.name}: publish of version {version} but the weights are {self.tx.version}")
        state = state_copy(self.policy)
        return state, TimedResult(self.name, "publish", t0, time.time(), version)

    def publish_broadcast(self, version: int) -> TimedResult:
        t0 = time.time()
        if version != self.tx.version:
            raise RuntimeError(f"{self.name}: publish of version {version} but the weights are {self.tx.version}")
        broadcast_send(self.policy, self._publish_group)
        return TimedResult(self.name, "publish", t0, time.time(), version)

    def evaluate(self, grid: int):
        """TimedResult(value=(eval reward, the first ``grid`` eval samples)) with the (EMA) weights."""
        from digenrl.train.evaluate import evaluate

        t0 = time.time()
        cfg = self.cfg
        with self.ctx.eval_weights():
            r, batch = evaluate(self.policy, self.task.eval_prompts(cfg.eval.num_prompts), self.reward,
                                self.sampler, run_seed=cfg.seed, num_steps=cfg.sampler.eval_num_steps)
        sample = batch.select(list(range(min(grid, len(batch)))))
        return TimedResult(self.name, "eval", t0, time.time(), (r, sample))

    def checkpoint_bytes(self, meta: dict) -> TimedResult:
        """The checkpoint file's bytes (the driver writes them atomically where the run lives)."""
        import tempfile
        from pathlib import Path

        from digenrl.observe.run_outputs import save_checkpoint

        t0 = time.time()
        with tempfile.TemporaryDirectory() as d, self.ctx.eval_weights():
            data = save_checkpoint(self.policy, Path(d), meta).read_bytes()
        return TimedResult(self.name, "checkpoint", t0, time.time(), data)

    def measure(self, gen_sizes: list[int], cell_sizes: list[int], repeats: int) -> dict:
        """Seconds of generation (per fragment size), training (per chunk size), commit and publish."""
        from .profile import time_generation, time_training

        gen = time_generation(self, self.policy, gen_sizes, repeats) if gen_sizes else {}
        return {"generate": gen, **time_training(self, cell_sizes, repeats)}
