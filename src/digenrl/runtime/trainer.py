"""``TrainerWorker``: one rank of the trainer pool (a Ray actor), also a colocated worker; its calls:
``workers.TrainerAPI`` (the calls outside a step's work: ``trainer_state``).

State: the policy, optimizer, reference policy, EMA (rank 0) and the step's ``GradientTransaction``
(``train.context.build_context``). The ranks form one torch.distributed group; the transaction's commit is the
only gradient sync.

* ``train``: fetch the group's fragments (cached per group), compute its advantages from the executor's
  rewards (deterministic: every rank gets the same), record the chunk's cells in the round's transaction (a
  cell trained twice or foreign to the round is refused: I2) and accumulate the gradient of ``train_cells``
  with the cell scale of ``train.loss_scale`` (1 / S); with ``train.best_of_n``, ``zero_adv_refill`` or
  ``minibatch_split=samples`` only the round's samples (``train.sample_masks.round_masks``). The transaction
  opens at the rank's first chunk of the round (a step has epochs x minibatches rounds). With step-wide
  advantage statistics (``std_mode=global``, ``adv_baseline=batch``) a round that opens before every reward of
  the step is in is a ``loss_scale.DeferredRound`` (provisional heads, corrected at the commit:
  ``algo.deferred_std``).
* ``generate``: TAG (or colocated generation) with the rank's own weights, which must be the committed version
  (on-policy, I3), under no_grad (the accumulated gradients and the optimizer are untouched).
* ``commit``: a deferred round's heads corrected, all-reduce (SUM), gradients times the commit scale of
  ``train.loss_scale`` (1 / the round's kept trajectories), clip, optimizer step on every rank at once, EMA on
  rank 0 (``train.ema_update``); only the ``final`` round bumps the version. ``abort`` drops an open
  transaction (no partial round is ever committed).

Sharded pool (``train.sharding: fsdp``): every call is a collective of the group's ranks. ``train`` trains the
rank's share of the chunk's cells (``rank_cells``; a rank whose share holds only zero-advantage cells still
forwards); ``generate`` samples the rank's round-robin share of the generations (a rank without one samples a
throw-away copy of the first so that its forwards match the others') and returns (None, info) when it has
none; ``publish`` / ``checkpoint_bytes`` gather the full state on every rank and only rank 0 returns it.

Sequence-parallel pool (``train.sequence_parallel`` = d): d consecutive ranks form a lane that trains and
generates as one rank would, each with 1 / d of every sequence; only a lane's lead reports statistics and
trajectories, and the commit's sum over ranks adds the lane's partial gradients. Rank 0's lane keeps the EMA on
every rank (an eval's forwards are collectives of the lane).

Collective timeout: a collective call (``collectives.collective_action``) that waits longer than
``runtime.collective_timeout_s`` raises ``CollectiveTimeout`` naming the worker, its rank and the call (gloo;
under NCCL the watchdog aborts the process instead)."""

from __future__ import annotations

import time
from dataclasses import replace

from digenrl.control.run_plan import grad_sum_fp64, plan_run
from digenrl.train.nft_old import after_commit, sampling_weights
from digenrl.train.old_logprob import sync_step_start
from digenrl.train.memory_check import trainer_generation_batch
from digenrl.train.sharding import full_trainable_state

from .collectives import collective_action
from .messages import ChunkResult, CommitResult, TimedResult
from .publish import init_groups, local_state, stream_send
from .trainer_state import TrainerState
from .worker_base import WorkerBase, fetch
from digenrl.train.sequence_parallel import lane_role
from digenrl.schedule.layout import grid_cells
from digenrl.schedule import step_number
from .workers import TrainerAPI


class TrainerWorker(TrainerState, WorkerBase, TrainerAPI):
    pool = "trainer"

    def __init__(self, name: str, config: dict, rank: int, hooks=None, log_file: str | None = None, *,
                 ctx=None):
        """``ctx``: a ``train.context.RunContext`` built by an in-process caller (``runtime.local.colocated_worker``:
        a policy given as an object); default: built from ``config``."""
        super().__init__(name, config, hooks, log_file)
        from digenrl.train.context import build_context

        self.rank = rank
        self.ctx = ctx if ctx is not None else build_context(self.cfg)
        if rank >= self.cfg.train.sequence_parallel.degree and self.cfg.train.sharding == "none":
            self.ctx.ema = None  # only rank 0 (its lane) evaluates and saves (under FSDP every rank holds its shard)
        self.task, self.reward, self.sampler = self.ctx.task, self.ctx.reward, self.ctx.sampler
        self.tx = self.ctx.transaction
        self.tx.fp64 = grad_sum_fp64(self.cfg)
        self._groups: dict[tuple[int, int], object] = {}
        self._deferred = None  # the open round's train.loss_scale.DeferredRound (step-wide statistics not all in)
        self._round = 0  # rounds committed in the current step (the weights changed since its version)
        self._plan = plan_run(self.cfg).plan
        self.gen_batch = min(self.gen_batch, trainer_generation_batch(self.cfg) or self.gen_batch)  # (None: no bound)
        self._stream = None   # broadcast / stream publish: (this rank, its group) where it is a sender
        self._sends: list = []  # the async sends of its last stream publish (waited for before the next)
        self._world = 1
        self._gsize, self._local = 1, 0  # ranks behind this rank's scheduler trainer, its index (``setup_dist``)
        self.sharded = False  # an FSDP pool of more than one rank (set by ``setup_dist``)
        self._lane = lane_role(0, 1, 1)  # its sequence-parallel lane (``train.sequence_parallel``; ``setup_dist``)
        self._copy, self._copy_version = None, None  # TAG inference copy (tuning.tag_inference_copy)
        self.check_failure("startup")

    @property
    def policy(self):
        return self.ctx.policy

    def setup_dist(self, spec) -> bool:
        """Join the process group(s); then every rank starts from rank 0's weights (as DDP does). Hybrid
        sharding (``spec.shard_size``): the rank's shard group is its FSDP mesh, and its replica group (the
        ranks of the same shard in the other groups) sums the gradient shards at the commit."""
        import torch.distributed as dist

        groups = init_groups(spec, self.cfg.runtime.collective_timeout_s)
        self._stream = groups.streams[0] if groups.streams else None
        self.tx.process_group = groups.trainer
        self._world = len(spec.trainer_ranks)
        d = self.cfg.train.sequence_parallel.degree
        fsdp = self.cfg.train.sharding == "fsdp"
        self._gsize = (spec.shard_size or self._world) if fsdp else d  # ranks behind this rank's scheduler trainer
        self._local = self.rank % self._gsize          # its rank inside the group
        self._lane = lane_role(self._local, self._gsize, d)
        if fsdp:  # every rank built the same weights (same seed / checkpoint)
            from digenrl.train.sharding import shard_context

            shard_context(self.ctx, groups.shard, replica_group=groups.replica)
            self.tx = self.ctx.transaction
            self.tx.fp64 = grad_sum_fp64(self.cfg)
            self.sharded = True
        elif self._world > 1:
            for p in self.policy.parameters():
                dist.broadcast(p.data, src=0, group=groups.trainer)
        if d > 1:  # after FSDP (its hooks first), before any forward
            from digenrl.train.sequence_parallel import sequence_context

            sequence_context(self.ctx, groups.sequence)
        return True

    # ---- training ------------------------------------------------------------------------------------
    def _group(self, step: int, group: int, refs: list, rewards: dict):
        key = (step, group)
        g = self._groups.get(key)
        if g is None:
            from digenrl.rollout.records import TrajectoryBatch

            g = TrajectoryBatch.cat([b for b in fetch(refs) if b is not None])  # None: a rank's empty share
            bad = sorted({int(v) for v in g.version.tolist()} - {step, step - 1})
            if bad or sorted(g.gen_index.tolist()) != list(range(self.cfg.train.generations)):
                raise RuntimeError(f"{self.name}: group {group} of step {step_number(step)} has generations "
                                   f"{g.gen_index.tolist()} and versions {g.version.tolist()} (I4: staleness <= 1)")
            mine = rewards.get(group, ())
            got = [float(mine[i]) if i < len(mine) else None for i in g.gen_index.tolist()]
            if got != [float(r) for r in g.rewards.tolist()]:
                raise RuntimeError(f"{self.name}: group {group} of step {step_number(step)}: the executor's rewards "
                                   f"{got} are not those of the trajectories {g.rewards.tolist()}")
            self._groups[key] = g
        return g

    @collective_action
    def train(self, chunk, refs: list, rewards: dict, parts: dict) -> ChunkResult:
        from digenrl.train.chunk_loss import train_cells
        from digenrl.train.loss_scale import DeferredRound, loss_scale, step_advantages
        from digenrl.train.sample_masks import masked_cells, round_masks
        from digenrl.train.step_math import adv_options

        self.check_failure(chunk.step)
        t0 = time.monotonic()
        if self.tx.version != chunk.step or self._round != chunk.round:
            raise RuntimeError(f"{self.name}: chunk of step {step_number(chunk.step)} round {chunk.round} but the "
                               f"weights are version {self.tx.version} after {self._round} rounds")
        t = self.cfg.train
        S = len(self.ctx.plan(chunk.step).trained)
        if not self.tx.open:
            prompts = self.prompts(chunk.step)
            uids = [prompts[g].uid for g in self._plan.round_groups(chunk.round)]
            self.tx.begin(chunk.step, grid_cells(uids, t.generations, S))
            self._deferred = None
            if t.step_wide and len(rewards) < self._plan.prompts:  # the step's statistics are not known yet
                self._deferred = DeferredRound(adv_options(t), self.ctx.loss, self.tx.params, rewards,
                                               step_start=chunk.round == 0)
            if chunk.round == 0:  # train.old_logprob=recompute: the step's starting weights (held since the commit)
                sync_step_start(self.policy, chunk.step)
        group = self._group(chunk.step, chunk.group, refs, rewards)
        uid = group.prompts[0].uid
        cells = tuple((uid, g, j) for g, j in chunk.cells)
        self.tx.record(cells)
        mine, weight = list(chunk.cells), 1.0
        if self._gsize > 1:  # a collective: every rank gets this chunk and trains its lane's share of the cells
            from digenrl.train.sharding import rank_cells

            mine, weight = rank_cells(chunk.cells, self._lane.lane, self._lane.lanes)
        masks = round_masks(self.cfg, self._plan, rewards, parts, step=chunk.step, round=chunk.round)
        if masks is not None:  # best_of_n / zero_adv_refill / minibatch_split=samples|generations: the round's
            # samples only
            mine, weight = masked_cells(mine, weight, masks[chunk.group], collective=self.sharded,
                                        chunk=chunk.cells)
        scale = loss_scale(S).cell(weight)
        if not mine:  # none of the share's cells trains this round (unsharded: nothing to run)
            pass
        elif self._deferred is not None:
            stats = self._deferred.train(self.policy, group, chunk.group, rewards[chunk.group], mine,
                                         loss_scale=scale, ref_policy=self.ctx.ref_policy, collective=self.sharded)
        else:
            if group.advantages is None:
                group.advantages = step_advantages(rewards, t, parts)[chunk.group][group.gen_index]
            # the round's mask already dropped the cells that do not train (the filter included, and
            # train.zero_adv_refill's re-added A = 0 samples kept): train_cells filters nothing more
            settings = self.ctx.loss if masks is None else replace(self.ctx.loss, filter_zero_advantage=False)
            stats = train_cells(self.policy, group, mine, settings=settings, loss_scale=scale,
                                ref_policy=self.ctx.ref_policy, collective=self.sharded, step_start=chunk.round == 0)
            self.tx.fold()  # train.grad_sum=fp64: into the order-free float64 sums (train.transaction)
        if weight == 0.0 or not mine or not self._lane.lead:  # a throw-away cell that only joined the collectives,
            from digenrl.train.chunk_loss import CellStats  # none, or a lane's follower (its lead reports them)

            stats = CellStats()
        return ChunkResult(chunk, self.name, cells, stats, t0, time.monotonic())

    @collective_action
    def generate(self, fragment, version: int):
        """A fragment: ``generate_gang`` of the rank's lane's round-robin share of its generations."""
        mine = fragment.generations[self._lane.lane::self._lane.lanes]  # (one lane: all of them)
        batch, infos = self._generate((replace(fragment, generations=mine),), version)
        return batch, infos[0]

    @collective_action
    def generate_gang(self, share, version: int):
        """A gang over several prompt groups (``Generate.more``) on a shard group, or a packed colocated worker's
        share of the step (``StepPlan.packed``), in one action (``_generate``)."""
        return self._generate(share, version)

    def _generate(self, share, version: int) -> tuple:
        """``share`` generated together, in batches of at most ``train.memory_check.trainer_generation_batch``
        (what fits beside the rank's training state; no bound without ``train.memory_gb``). Without an inference
        copy a rank of a sharded pool without a share samples a throw-away copy of one generation so that its
        forwards still match the others'."""
        self.check_failure(share[0].step)
        if version != self.tx.version or self._round:
            raise RuntimeError(f"{self.name}: asked to generate {share} with version {version} but its weights "
                               f"are version {self.tx.version} after {self._round} rounds (TAG is on-policy only)")
        lead = self._lane.lead  # (``share`` is its lane's: a lane's ranks get the same one)
        if self.sharded and self._gsize > 1 and self.cfg.tuning.tag_inference_copy:
            return self.generate_parts(self._inference_copy(version), share, version, lead)
        with sampling_weights(self.policy):  # DiffusionNFT's old copy (train.nft_old_policy=soft), else as is
            if not self.sharded or self._gsize == 1 or any(p.generations for p in share):
                return self.generate_parts(self.policy, share, version, lead)
            *_, infos = self.generate_parts(self.policy, (replace(share[0], generations=(0,)),), version, lead)
        empty = tuple(replace(infos[0], fragment=p, uid=-1, rewards=(), reward_parts={}) for p in share)
        return (*([None] * len(share)), empty)

    def _inference_copy(self, version: int):
        """An unsharded policy holding the weights of ``version`` (the trainers' current ones): built on first
        use like a generator's, refreshed with one all-gather of the trainable state per version."""
        if self._copy_version != version:
            from digenrl.models.registry import build_policy

            with sampling_weights(self.policy):
                state = full_trainable_state(self.policy)  # every rank of the group calls it (a collective)
            if self._copy is None:
                self._copy = build_policy(self.cfg.model)
                sg = getattr(self.policy, "sequence_group", None)
                if sg is not None:  # its forwards split the sequence over the lane too
                    from digenrl.models.sequence_parallel import enable_sequence_parallel

                    enable_sequence_parallel(self._copy, sg.group)
            self._copy.load_trainable_state_dict(state)
            self._copy_version = version
        return self._copy

    @collective_action
    def commit(self, step: int, round: int, final: bool, rewards: dict, parts: dict) -> CommitResult:
        from digenrl.train.loss_scale import loss_scale, step_advantages
        from digenrl.train.sample_masks import round_masks

        self.check_failure(step)
        t0 = time.monotonic()
        self._finish_sends()
        if not self.tx.open:  # a rank without a chunk this round still joins the all-reduce
            self.tx.begin(step, None)
            self._deferred = None
        if self.tx.step != step or self._round != round:
            raise RuntimeError(f"{self.name}: commit of step {step_number(step)} round {round} but the open "
                               f"transaction is step {step_number(self.tx.step)} round {self._round}")
        t, groups = self.cfg.train, self._plan.round_groups(round)
        whole = t.step_wide or t.zero_adv_refill
        missing = sorted(set(range(self._plan.prompts) if whole else groups) - set(rewards))
        if missing:
            raise RuntimeError(f"{self.name}: commit of step {step_number(step)} round {round} without the rewards "
                               f"of groups {missing}")
        S = len(self.ctx.plan(step).trained)
        stats = None
        if self._deferred is not None:  # every reward is in: the heads with the step's scale, then the correction
            stats = self._deferred.finish(
                self.policy, {g: self._groups[(step, g)] for g in self._deferred.terms}, rewards, t,
                loss_scale=loss_scale(S).cell(), ref_policy=self.ctx.ref_policy, collective=self.sharded,
                process_group=self.tx.process_group, piece=self._plan.chunk_generations * self._plan.chunk_timesteps)
            self._deferred = None
            stats = stats if self._lane.lead else None  # a lane's lead reports its statistics
        final_adv = step_advantages(rewards, t, parts)
        keep = round_masks(self.cfg, self._plan, rewards, parts, step=step, round=round) or {}
        scale = loss_scale(S, [final_adv[g] for g in groups], t.filter_zero_advantage, [keep.get(g) for g in groups])
        seen_all = self._gsize == self._world  # one scheduler trainer: this rank ran every chunk
        out = self.tx.commit(check_complete=seen_all, grad_scale=scale.commit, final=final)
        if self.ctx.ema is not None:
            self.ctx.ema.update()
        after_commit(self.policy, final)  # DiffusionNFT's old copy moves after the step's last commit
        if final:  # recompute's step-start copy: the next step's starting weights (every rank joins a commit)
            sync_step_start(self.policy, self.tx.version)
        self._round = 0 if final else round + 1
        if final:
            for key in [k for k in self._groups if k[0] <= step]:
                del self._groups[key]
        return CommitResult(step, self.name, self.tx.version, out["grad_norm"], t0, time.monotonic(), stats,
                            scale.kept)

    def abort(self) -> int | None:
        step = self.tx.step
        self.tx.abort()
        self._groups.clear()
        self._deferred = None
        return step

    # ---- publishing, eval, checkpoints -----------------------------------------------------------------
    def _publish_start(self, version: int) -> float:
        """The start stamp of a publish of ``version``, which must be the weights' version."""
        if version != self.tx.version:
            raise RuntimeError(f"{self.name}: publish of version {version} but the weights are {self.tx.version}")
        return time.monotonic()

    @collective_action
    def publish(self, version: int):
        """Rank 0: (the object-store payload of ``version``, TimedResult)."""
        t0 = self._publish_start(version)
        with sampling_weights(self.policy):  # the generators sample with DiffusionNFT's old copy (soft)
            state = full_trainable_state(self.policy)  # CPU copies; a collective under FSDP (every rank gathers)
        if self._gsize > 1 and self.rank != 0:  # (rank 0's group: a collective gather, or a lane's followers)
            state = None
        return state, TimedResult(self.name, "publish", t0, time.monotonic(), version)

    @collective_action
    def publish_broadcast(self, version: int) -> TimedResult:
        t0 = self._publish_start(version)
        with sampling_weights(self.policy):  # (unsharded: views of the parameters, sent inside the block)
            state = full_trainable_state(self.policy) if self.sharded else self.policy.trainable_state_dict()
            for w in stream_send(state, *self._stream) if self._stream is not None else ():
                w.wait()
        return TimedResult(self.name, "publish", t0, time.monotonic(), version)

    @collective_action
    def publish_stream(self, version: int) -> TimedResult:
        """A sender (``publish.stream_send``): start the asynchronous sends of its shards of ``version`` and
        return; the rank goes on with its next call while they drain."""
        t0 = self._publish_start(version)
        self._finish_sends()
        if self._stream is not None:
            with sampling_weights(self.policy):  # the generators sample with DiffusionNFT's old copy (soft)
                state = local_state(self.policy.trainable_state_dict())
            self._sends = stream_send(state, *self._stream)
        return TimedResult(self.name, "publish", t0, time.monotonic(), version)

    def _finish_sends(self) -> None:
        """Wait for the sends of the last stream publish (done by now in a scheduled run: the scheduler starts
        no commit before the publish ended); a send that fails or times out raises here."""
        sends, self._sends = self._sends, []
        for w in sends:
            w.wait()
