"""The trainer rank's calls outside a step's work (part of ``TrainerWorker``, ``runtime.trainer``): the eval and
the checkpoint of the (EMA) weights on rank 0, the resumable state at a step boundary (``pack_state`` /
``restore_state``, ``train.checkpoint``; sharded: each rank's shards) and the calibration's per-op calls
(``timing.Calibration``). Every test-hook phase outside a step (``eval``, ``checkpoint``, ``calibrate``) fires
here."""

from __future__ import annotations

import time

from digenrl.train.old_logprob import sync_step_start

from .collectives import collective_action
from .messages import TimedResult
from .worker_base import WorkerBase


class TrainerState:
    """Mixed into ``TrainerWorker``: uses its ``ctx``, ``tx``, ``policy``, ``rank``, ``sharded`` and round state."""

    @collective_action
    def evaluate(self, grid: int):
        """TimedResult(value=(eval reward, the first ``grid`` eval samples)) with the (EMA) weights."""
        from digenrl.train.evaluate import evaluate

        self.check_failure("eval")
        t0 = time.monotonic()
        cfg = self.cfg
        with self.ctx.eval_weights():
            r, batch = evaluate(self.policy, self.task.eval_prompts(cfg.eval.num_prompts), self.reward,
                                self.sampler, run_seed=cfg.seed, num_steps=cfg.sampler.eval_num_steps,
                                max_batch=self.gen_batch)
        sample = batch.select(list(range(min(grid, len(batch)))))
        value = (r, sample) if self.rank == 0 else None  # sharded: every rank ran the collective forwards
        return TimedResult(self.name, "eval", t0, time.monotonic(), value)

    @collective_action
    def checkpoint_bytes(self, meta: dict) -> TimedResult:
        """The checkpoint file's bytes (the driver writes them atomically where the run lives)."""
        from digenrl.runtime.run_outputs import checkpoint_bytes

        t0 = time.monotonic()
        with self.ctx.eval_weights():
            state = None
            if self.sharded:  # gather the full (EMA) state on every rank, write it on rank 0
                from digenrl.train.sharding import full_state

                policy = self.policy
                state = full_state(policy.state_dict() if hasattr(policy, "save") else policy.trainable_state_dict())
            data = checkpoint_bytes(self.policy, meta, state) if self.rank == 0 else None
        return TimedResult(self.name, "checkpoint", t0, time.monotonic(), data)

    @collective_action
    def pack_state(self, step: int, counters: dict) -> TimedResult:
        """value = the resumable state (``train.checkpoint``) after ``step`` committed steps, at a step boundary."""
        from digenrl.train.checkpoint import pack_train_state

        self.check_failure("checkpoint")
        t0 = time.monotonic()
        if self._round or self.tx.open or self.tx.version != step:
            raise RuntimeError(f"{self.name}: no step boundary to checkpoint (version {self.tx.version}, "
                               f"{self._round} rounds of the next step committed, transaction open: {self.tx.open})")
        data = None  # (a follower of rank 0's lane: the driver keeps rank 0's)
        if self.sharded:
            from digenrl.train.sharded_checkpoint import pack_sharded_state

            data = pack_sharded_state(self.ctx, self.cfg.run_dir, step=step, counters=counters, rank=self.rank)
        elif self.rank == 0:
            data = pack_train_state(self.ctx, step=step, counters=counters)
        return TimedResult(self.name, "checkpoint", t0, time.monotonic(), data)

    @collective_action
    def restore_state(self, data: bytes) -> int:
        """Load a resumable state (weights, optimizer, EMA on rank 0, version); returns its version."""
        from digenrl.train.checkpoint import restore_train_state, unpack

        state = unpack(data)
        if state.sharded is not None:
            from digenrl.train.sharded_checkpoint import restore_sharded_state

            restore_sharded_state(self.ctx, self.cfg.run_dir, state)
        else:
            restore_train_state(self.ctx, state)
        sync_step_start(self.policy, self.tx.version, force=True)
        self._round = 0
        self._groups.clear()
        self._deferred = None
        return self.tx.version

    calibration_run = collective_action(WorkerBase.calibration_run)  # (a collective of a sharded pool's ranks)
