"""``run_disaggregated(cfg)``: the controller of a Ray run; the same run outputs as ``train.loop.run_training``.

The controller runs ``digenrl.control.loop.run_loop`` (the simulator's control loop) with the ``RayExecutor``;
it moves object refs, never tensors. After each commit it may ask trainer rank 0 for an eval (``eval.every``)
or a resumable checkpoint (``runtime.checkpoint_every``, ``train.checkpoint``), written atomically.

Recovery (invariant I6): when a worker raises, dies or stalls (no answer within the watchdog budget), the
attempt is abandoned: every open transaction is dropped, every actor is killed, fresh pools are started from
the newest resumable checkpoint (or from the initial weights) and the scheduler replays from that step. By I5
the replay generates the same trajectories, so the run ends with the parameters of an uninterrupted run.
``runtime.max_restarts`` bounds the restarts; past it ``WorkerFailure`` names the worker and the step (the
checkpoints stay valid). A worker that stopped on a non-finite value (``digenrl.faults.RunHalted``: a reward's
NaN score, a refused commit) is not restarted, since the replay would compute the same value: its error is
raised as is (the CLI: ``failure.json``, exit 2) and the checkpoints written before it stay the newest. Nor is a
deterministic error (``faults.find_deterministic``: a missing file, a bad-input error, torch without CUDA). A first SIGINT/SIGTERM abandons the step, checkpoints the last committed state and
raises ``Interrupted``. Restarts are reported in ``summary.json`` (``recoveries``: cause, replayed-from step,
restart and lost seconds), in the metrics (``restarts``) and as ``recovery`` spans in the trace.

Besides the reference loop's outputs a run writes ``trace.json`` / ``gantt.png`` (``control.timeline``),
``trajectories.jsonl`` (``step_metrics``), ``profile.json`` (the costs timed on the workers before step 1: TAG
modes, or every run with ``runtime.calibration.when=always``), ``profile_observed.json`` (the costs its spans
showed, ``control.observed``) and, when it failed, ``failure.json``.
"""

from __future__ import annotations

import logging
import time

from digenrl.config import Config
from digenrl.control.loop import Completion, run_loop
from digenrl.control.run_plan import RunPlan, plan_run
from digenrl.control.timeline import Timeline
from digenrl.faults import find_deterministic, find_halted
from digenrl.observe.run_dir import RunStart
from digenrl.observe.run_outputs import RunOutputs
from digenrl.schedule import Commit, Durations, Scheduler, StepStats
from digenrl.train import checkpoint as ckpt

from .clocks import Clock
from .cluster import ActorPools, get_named, ray_session, start_pools
from .deadlines import ObservedCosts, call_deadline, remote_reward_wait
from .errors import WorkerFailure
from .executor import RayExecutor
from .step_metrics import StepMetrics

logger = logging.getLogger(__name__)


def run_disaggregated(cfg: Config, start: RunStart | None = None, stop=None) -> dict:
    """Train with the Ray runtime (``runtime.mode``); writes every run output into ``cfg.run_dir``.

    ``start``: fresh, overwrite or resume (``observe.run_dir.plan_run_dir``); ``stop``: the CLI's
    ``StopRequest`` (its signal handler raises ``Interrupted`` in this thread)."""
    run = plan_run(cfg)  # config errors before anything is written or started
    with ray_session(run):  # placement errors too
        out = RunOutputs(cfg, start)
        try:
            return _Controller(run, out, start).train()
        finally:
            out.close()


class _Controller:
    def __init__(self, run: RunPlan, out: RunOutputs, start: RunStart | None):
        self.run, self.cfg, self.plan, self.out = run, run.cfg, run.plan, out
        self.clock, self.timeline = Clock(), Timeline(run.plan)
        self.metrics = StepMetrics(run.plan, out.run_dir)
        self.stats = [StepStats(k, generations=run.plan.batch) for k in range(run.plan.steps)]
        self.recoveries: list[dict] = []
        self._cost = None  # the cost model of the current attempt (a ProfileCost where the run has a profile)
        self._observed = ObservedCosts()  # the run's action times (all attempts): the watchdog without a cost model
        self.first, self.state, self.counters = 0, None, {}
        if start is not None and start.kind == "resume":
            self.first, self.state = start.step, start.checkpoint.read_bytes()
            self.counters = ckpt.unpack(self.state).counters
            out.eval0 = self.counters.get("eval0", float("nan"))
        self.wall0 = self.counters.get("wall_s", 0.0)
        self.pools: ActorPools | None = None
        self.sched: Scheduler | None = None
        self._attempt_start, self._log_start = 0.0, 0  # clock time and log index where the attempt began
        self._controller_cpu_s = 0.0
        self._evaluated = False  # the initial eval (run_outputs.before) is done

    # ---- attempts ------------------------------------------------------------------------------------
    def train(self) -> dict:
        from digenrl.train.interrupt import as_interrupted

        failure = self.run.failure  # the test hook fails the first attempt only
        try:
            while True:
                self.pools = start_pools(self.run, self.state, failure)
                self._restarted()
                try:
                    return self._attempt()
                except Exception as err:  # a stop signal first, whatever error it came back as (as_interrupted)
                    e = as_interrupted(err)
                    if e is not None:
                        e.step, e.checkpoint = self._checkpoint_on_stop()  # the actors still live: the last commit
                        raise e from None
                    if not isinstance(err, WorkerFailure):
                        raise
                    e = err
                    halted = find_halted(e)
                    if halted is not None:  # a non-finite reward / commit: a replay would meet it again
                        raise _on_worker(halted, e.worker) from None  # (the actors are killed below)
                    if find_deterministic(e) is not None:  # a missing file, bad config, no CUDA: same on replay
                        raise
                    self._recover(e)
                    failure = None
                finally:
                    self.pools.kill()
        except Exception as err:
            e = as_interrupted(err)
            if e is not None:
                if e.checkpoint is None:  # stopped before an attempt ran: the newest checkpoint stays the one
                    path = ckpt.latest_checkpoint(self.out.run_dir)
                    e.step, e.checkpoint = (None if path is None else ckpt.read_train_state(path).step), path
                raise e from None
            if isinstance(err, WorkerFailure):
                resumable = ckpt.latest_checkpoint(self.out.run_dir) is not None  # --resume only from a checkpoint
                self.out.failure({"worker": err.worker, "step": err.step, "action": err.action, "error": str(err),
                                  "restarts": len(self.recoveries),
                                  "deterministic": find_deterministic(err) is not None,
                                  "resume": f"digenrl train --resume {self.cfg.run_dir}" if resumable else None})
            raise
        finally:
            self.metrics.close()

    def _attempt(self) -> dict:
        from .calibrate import cost_model

        cfg, plan, pools = self.cfg, self.plan, self.pools
        if self.first == 0 and not self._evaluated:  # (again after a failure in the first eval itself)
            self.out.before(*_eval(pools, plan, cfg.eval.grid_prompts, cfg))
            self._evaluated = True
            if not self.recoveries:
                self.clock.reset()
        cost = self._cost = cost_model(self.run, pools, self.out.run_dir if not self.recoveries else None)
        self._attempt_start, self._log_start = self.clock.now(), len(self.timeline.log)
        self.sched = Scheduler(plan, cost=cost, bts_config=cfg.runtime.bts_config(), first_step=self.first)
        ex = RayExecutor(self.run, pools, self.clock, self.first, _watchdog(self.run, cost, self._observed),
                         self._observed)
        self.metrics.replay_from(self.first, len(self.recoveries), self._attempt_start)
        cpu0 = time.process_time()
        end = run_loop(self.sched, ex, self.timeline, _BetweenSteps(self, ex), t0=self._attempt_start)
        self._controller_cpu_s = time.process_time() - cpu0  # the controller's own CPU (scheduler, BTS, Ray calls)
        self.out.after(*_eval(pools, plan, cfg.eval.grid_prompts, cfg))
        meta = {"steps": str(cfg.steps), "version": str(self.sched.published)}
        self.out.write_checkpoint(get_named(pools.on_rank0("checkpoint_bytes", meta), "checkpoint",
                                            call_deadline(cfg))[0].value)  # fmt: skip
        return self._finish(end)

    def _finish(self, end: float) -> dict:
        from digenrl.schedule.audit import audit

        cfg, plan = self.cfg, self.plan
        if cfg.runtime.checkpoint_every and self.sched.published > self._last_checkpoint():
            self._save_state(self.sched.published)  # a finished run can be extended with --resume steps=<more>
        self._merge_stats()
        result = self.timeline.result(self.sched, end)
        result.stats = self.stats
        result.write_trace(self.out.run_dir / "trace.json")
        self._write_observed_profile(result.spans)
        result.write_gantt(self.out.run_dir / "gantt.png", f"{cfg.runtime.mode}: {result.pools_label()}, "
                                                           f"{plan.steps} steps (measured)")
        log, events = self._last_attempt_log()
        return self.out.finish(wall_s=self.wall0 + end, version=self.sched.published, **result.timing(),
                               audit_violations=audit(plan, log, events, self.first)[:20], bts=result.bts,
                               restarts=len(self.recoveries), recoveries=self.recoveries,
                               controller_cpu_s=self._controller_cpu_s, cost_scales=self.sched.cost_scales,
                               clock_error_s=self.pools.clock_error_s)

    def _write_observed_profile(self, spans) -> None:
        """``profile_observed.json``: the op costs this run's spans showed (``control.observed``), laid over the
        run's calibration curves where it has one (``rescaled_profile``), for planning the next run on the same
        machines. A run too short to show every op kind writes none."""
        from digenrl.control.observed import observed_profile, rescaled_profile
        from digenrl.control.profile import ProfileCost, save_profile

        try:
            data = observed_profile(spans, self.plan.sampling_steps, source=f"spans of {self.cfg.run_dir}",
                                    pools=(len(self.pools.generators), len(self.pools.trainers)),
                                    streamed=self.plan.publish_streams)
        except ValueError as e:
            logger.info("no profile_observed.json: %s", e)
            return
        if isinstance(self._cost, ProfileCost):
            data = rescaled_profile(self._cost, data, self.plan.sampling_steps)
        save_profile(data, self.out.run_dir / "profile_observed.json")

    def _recover(self, e: WorkerFailure) -> None:
        """Abandon the attempt and set up the replay from the newest checkpoint. Nothing is asked of the old
        actors: ``train`` kills them next, which drops every open transaction, and a stalled or dead worker
        would not answer (an abort call waited ``_abort``'s 30 s for it before every restart after a stall)."""
        detected = self.clock.now()
        self._merge_stats()
        if len(self.recoveries) >= self.cfg.runtime.max_restarts:
            raise e
        path = ckpt.latest_checkpoint(self.out.run_dir)
        self.first, self.state = (0, None) if path is None else (ckpt.read_train_state(path).step, path.read_bytes())
        published = self.stats[self.first - 1].published if self.first else None
        self.recoveries.append({"worker": e.worker, "step": e.step, "action": e.action, "cause": e.cause,
                                "detected_s": detected, "replay_from_step": self.first,
                                "lost_from_s": published if published is not None else self._attempt_start})

    def _restarted(self) -> None:
        """Fresh pools are up (their workers' clock offsets from now on); after a failure: time the restart and
        the lost work, draw it in the trace."""
        self.clock.use(self.pools.clock_offsets)
        if not self.recoveries or "restart_s" in self.recoveries[-1]:
            return
        rec, ready = self.recoveries[-1], self.clock.now()
        rec["restart_s"], rec["lost_s"] = ready - rec["detected_s"], ready - rec["lost_from_s"]
        for w in self.plan.generators + self.plan.trainers:
            self.timeline.span(w, "recovery", rec["detected_s"], ready, f"restart after {rec['worker']} failed")

    def _merge_stats(self) -> None:
        """Keep the scheduler's statistics of every step the current attempt published."""
        for k in range(self.sched.train_step if self.sched else 0):
            st = self.sched.stats[k]
            if st.published is not None and st.committed is not None:
                self.stats[k] = st

    # ---- checkpoints ---------------------------------------------------------------------------------
    def _save_state(self, step: int, data: bytes | None = None) -> None:
        if data is None:
            data = get_named(self.pools.on_rank0("pack_state", step, self._counters()), "checkpoint",
                             call_deadline(self.cfg))[0].value  # fmt: skip
        ckpt.write_checkpoint(self.out.run_dir, step, data, keep=self.cfg.runtime.keep_checkpoints)

    def _counters(self) -> dict:
        return {"eval0": self.out.eval0, "wall_s": self.wall0 + self.clock.now()}

    def _last_checkpoint(self) -> int:
        """The step of the newest checkpoint file (-1: none)."""
        found = ckpt.list_checkpoints(self.out.run_dir)
        return found[-1][0] if found else -1

    def _checkpoint_on_stop(self):
        """After a signal: drop the open step and checkpoint the last committed state (if at a step boundary)."""
        if self.pools is None or self.sched is None:
            return None, ckpt.latest_checkpoint(self.out.run_dir)
        _abort(self.pools)
        step = self.sched.train_step
        try:
            if step > self._last_checkpoint():
                self._save_state(step)
        except WorkerFailure:  # mid-step (a minibatch committed) or a dead rank 0: the newest checkpoint stays
            pass
        path = ckpt.latest_checkpoint(self.out.run_dir)
        return (None if path is None else ckpt.read_train_state(path).step), path

    def _last_attempt_log(self):
        log = self.timeline.log[self._log_start:]
        first_t = log[0][0] if log else 0.0
        return log, [ev for ev in self.timeline.events if ev.time >= first_t - 1e-9]


class _BetweenSteps:
    """The control loop's observer in a Ray run: step metrics, and evals / checkpoints between steps, on
    trainer rank 0 and off the schedule."""

    def __init__(self, ctl: _Controller, ex: RayExecutor):
        self.ctl, self.ex = ctl, ex
        self._evals: dict[int, float | None] = {}   # version -> eval reward (None: requested, not back yet)
        self._rows: list[dict] = []

    def on_completion(self, c: Completion) -> None:
        ctl = self.ctl
        ctl.metrics.record(c)
        if c.side == "eval":
            reward, sample = c.results[0].value  # sample: the grid's eval samples (none without TensorBoard / wandb)
            self._evals[c.step] = reward
            ctl.out.eval_grid(c.step, reward, sample)
        elif c.side == "checkpoint":
            ctl._save_state(c.step, c.results[0].value)
        elif isinstance(c.action, Commit) and c.action.final:
            self._after_commit(c.action.step + 1)

    def _after_commit(self, version: int) -> None:
        ctl = self.ctl
        cfg, pools = ctl.cfg, ctl.pools
        if version <= ctl.metrics.logged:  # a replayed step: its eval is in the metrics already
            return
        if cfg.eval.every and version % cfg.eval.every == 0 and version < cfg.steps:
            self._evals[version] = None
            grid = cfg.eval.grid_prompts if ctl.out.writer.sends_images else 0  # the grid goes to TensorBoard / wandb
            self.ex.side(pools.on_rank0("evaluate", grid), "eval", version)
        if ckpt.due(version, cfg.runtime.checkpoint_every) and version < cfg.steps:
            self.ex.side(pools.on_rank0("pack_state", version, ctl._counters()), "checkpoint", version)

    def after_wait(self) -> None:
        """Write rows in step order; a row whose eval is still running waits for it."""
        ctl = self.ctl
        self._rows.extend(ctl.metrics.rows_ready(ctl.timeline.spans))
        while self._rows:
            step = self._rows[0]["step"]
            if step in self._evals:
                if self._evals[step] is None:
                    return
                self._rows[0]["eval_reward"] = self._evals.pop(step)
            self._rows[0]["restarts"] = len(ctl.recoveries)
            if 1 <= step <= len(ctl.sched.stats):  # row k + 1: the online cost factors BTS planned step k with
                self._rows[0].update({f"cost_scale/{k}": v for k, v in ctl.sched.stats[step - 1].cost_scales.items()})
            ctl.out.log(self._rows.pop(0))


def _on_worker(e, worker: str):
    """``e`` (a worker's ``RunHalted``) with the worker named in its message."""
    try:
        return type(e)(f"{e} (on worker {worker})")
    except Exception:  # a subclass with another signature: keep it as it came
        return e


def _eval(pools: ActorPools, plan, grid: int, cfg=None):
    """(eval reward, the first ``grid`` eval samples) with rank 0's (EMA) weights."""
    deadline = None if cfg is None else call_deadline(cfg) + remote_reward_wait(cfg)  # an eval scores its samples
    return get_named(pools.on_rank0("evaluate", grid), "eval", deadline)[0].value


def _watchdog(run: RunPlan, cost, observed: ObservedCosts | None = None):
    """Seconds a call may take before its worker counts as stalled: ``runtime.watchdog_s``; else, with a cost
    model, 60 s + 20 x the action's modelled duration; else the bound from the run's observed action times
    (``deadlines.ObservedCosts.deadline``: ``DEFAULT_OP_S`` until one of its kind completed). A side call
    (``action`` None: an eval or a checkpoint between steps) gets ``deadlines.call_deadline`` in every case. A generation (it scores its samples)
    with a remote reward gets the reward client's own retry window on top (``remote_reward_wait``): the client
    waits out a service outage that long, and only past it is the worker at fault."""
    from digenrl.schedule.actions import Generate

    fixed, wait = run.cfg.runtime.watchdog_s, remote_reward_wait(run.cfg)
    side = call_deadline(run.cfg) + wait  # a side call (an eval between steps scores; a checkpoint): deadlines.py
    dur = Durations(run.plan, cost) if cost is not None else None
    observed = ObservedCosts() if observed is None else observed

    def budget(action) -> float | None:
        if action is None:
            return side
        scoring = wait if isinstance(action, Generate) else 0.0
        if fixed is not None:
            return fixed + scoring
        return (observed.deadline(action) if dur is None else 60.0 + 20.0 * dur.of(action)) + scoring

    return budget


def _abort(pools: ActorPools, timeout_s: float = 30.0) -> None:
    """Drop every open transaction on the trainers still alive (best effort: the actors are killed next)."""
    import ray

    refs = [t.abort.remote() for t in pools.trainers.values()]
    ray.wait(refs, num_returns=len(refs), timeout=timeout_s)


__all__ = ["run_disaggregated"]
