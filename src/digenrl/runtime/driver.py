"""``run_training(cfg)``: the one controller of every training run, in every mode, Ray or in-process.

The controller runs ``control.loop.run_loop`` (the simulator's control loop) with the scheduler and a
``WorkerExecutor`` over the run's workers: Ray actors (``cluster``), or, for one colocated worker without
``--ray``, the same classes in this process (``local``). Between steps (``between_steps.BetweenSteps``) it
writes each step's metrics row, evals (``eval.every``, ``eval.guard``) and resumable checkpoints
(``runtime.checkpoint_every``), written atomically.

Recovery (invariant I6) and stopping (``train.interrupt.StopRequest``): docs/reliability.md, "Dead and stalled
workers" and "Signals". A worker that raises, dies or stalls ends the attempt (``_recover``): every worker is
ended, fresh pools start from the newest resumable checkpoint (or the initial weights) and the scheduler replays
from that step (by I5 the same trajectories), at most ``runtime.max_restarts`` times (then ``WorkerFailure``); a
non-finite value (``faults.RunHalted``) or a deterministic error (``faults.find_deterministic``) is raised as is.
The run outputs: docs/runtime.md and ``run_outputs``."""

from __future__ import annotations

import logging
import re
import time
from contextlib import nullcontext
from dataclasses import replace
from datetime import datetime

from digenrl.config import Config
from digenrl.control.loop import run_loop
from digenrl.control.observed import observed_profile, rescaled_profile
from digenrl.control.profile import ProfileCost, save_profile
from digenrl.control.run_plan import RunPlan, plan_run
from digenrl.control.timeline import Timeline
from digenrl.faults import find_deterministic, find_halted
from digenrl.observe.progress import eval_text, phase
from digenrl.runtime.run_dir import RunStart
from digenrl.runtime.run_outputs import FailureRecord, RunOutputs, resume_command, write_failure
from digenrl.schedule import Scheduler, StepStats, step_number
from digenrl.schedule.audit import audit
from digenrl.train import checkpoint as ckpt

from .between_steps import BetweenSteps, GuardStopped
from .clocks import Clock
from .calibrate import cost_model, measures
from .cluster import ray_session, start_pools, worker_log_dir
from .deadlines import ObservedCosts, call_deadline, remote_reward_wait, watchdog
from .errors import WorkerFailure
from .executor import WorkerExecutor
from .local import in_process, start_local_pools
from .pools import WorkerPools
from .step_metrics import StepMetrics

logger = logging.getLogger(__name__)


def uses_ray(run: RunPlan, ray: bool | None = None) -> bool:
    """Whether ``run`` runs on Ray: always with ``ray`` True (``digenrl train --ray``), else unless it is one
    colocated worker (``local.in_process``)."""
    return bool(ray) or not in_process(run)


def run_training(cfg: Config, start: RunStart | None = None, stop=None, *, ray: bool | None = None) -> dict:
    """Train ``cfg``; writes every run output into ``cfg.run_dir`` and returns the summary.

    ``start``: fresh, overwrite or resume (``runtime.run_dir.run_start``); ``stop``: the CLI's
    ``StopRequest`` (Ray: its signal handler raises ``Interrupted`` in this thread; in-process: polled at each
    step boundary); ``ray``: ``uses_ray``."""
    run = plan_run(cfg)  # config errors before anything is written or started
    ray = uses_ray(run, ray)
    if not ray and run.hooks is not None and run.hooks.fails and run.hooks.kind != "raise":
        from digenrl.config import ConfigError

        raise ConfigError(f"DIGENRL_TEST_HOOKS: inject_failure ':{run.hooks.kind}' ends or stops the worker's process, which "
                          "in-process is the run itself; use it on Ray (digenrl train --ray, or a Ray mode)")
    with ray_session(run) if ray else nullcontext():  # placement errors too
        out = RunOutputs(cfg, start)
        try:
            return _Controller(run, out, start, stop, local=not ray).train()
        finally:
            out.close()


class _Controller:
    def __init__(self, run: RunPlan, out: RunOutputs, start: RunStart | None, stop=None, local: bool = False):
        self.run, self.cfg, self.plan, self.out, self.stop, self.local = run, run.cfg, run.plan, out, stop, local
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
            out.restore(self.counters)  # the eval before RL and the guard's state
        self.wall0 = self.counters.get("wall_s", 0.0)
        self.pools: WorkerPools | None = None
        self.sched: Scheduler | None = None
        self._attempt_start, self._log_start = 0.0, 0  # clock time and log index where the attempt began
        self._controller_cpu_s = 0.0
        self._evaluated = False  # the initial eval (run_outputs.before) is done

    def start_pools(self, state: bytes | None, hooks) -> WorkerPools:
        """This run's workers, in-process or Ray actors: the one place they start (tests replace it)."""
        return (start_local_pools if self.local else start_pools)(self.run, state, hooks)

    def _startup_text(self) -> str:
        n_g, n_t = len(self.run.generator_ids), len(self.run.trainer_ids)
        where = f", restored after step {self.first}" if self.state is not None else ""
        model = f"{self.cfg.model.kind} from {self.cfg.model.path or 'the built-in weights'}{where}"
        if self.local:
            return f"{'reloading' if self.recoveries else 'loading'} {model}"
        pools = f"{n_g} generator(s) and {n_t} trainer rank(s)" if n_g else f"{n_t} worker(s)"
        again = "restarting" if self.recoveries else "starting"
        return f"{again} {pools} (each loads {model}; logs in {worker_log_dir(self.cfg)})"

    # ---- attempts ------------------------------------------------------------------------------------
    def train(self) -> dict:
        from digenrl.train.interrupt import as_interrupted

        hooks = self.run.hooks  # the test hook fails the first attempt only
        try:
            while True:
                with phase(self.cfg, self._startup_text()):
                    self.pools = self.start_pools(self.state, hooks)
                self._restarted()
                try:
                    return self._attempt()
                except Exception as err:  # a stop signal first, whatever error it came back as (as_interrupted)
                    e = as_interrupted(err)
                    if e is not None:
                        e.step, e.checkpoint = self._checkpoint_on_stop()  # the workers still live: the last commit
                        raise e from None
                    if not isinstance(err, WorkerFailure):
                        raise
                    e = err
                    _log_failure(self.cfg, e)  # the worker's traceback, as Ray returned it, into its own log
                    halted = find_halted(e)
                    if halted is not None:  # a non-finite reward / commit: a replay would meet it again
                        raise _on_worker(halted, e.worker) from None  # (the actors are killed below)
                    if find_deterministic(e) is not None:  # a missing file, bad config, no CUDA: same on replay
                        raise
                    self._recover(e)
                    hooks = hooks.without_failure() if hooks else None
                finally:
                    self.pools.kill()
        except Exception as err:
            e = as_interrupted(err)
            if e is not None:
                if e.checkpoint is None:  # stopped before an attempt ran: the newest checkpoint stays the one
                    e.step, e.checkpoint = _newest(self.out.run_dir)
                raise e from None
            if isinstance(err, WorkerFailure):
                path = ckpt.latest_checkpoint(self.out.run_dir)  # --resume only from a checkpoint
                write_failure(self.out.run_dir, FailureRecord(
                    "worker", str(err), step=err.step, worker=err.worker, action=err.action,
                    restarts=len(self.recoveries), deterministic=find_deterministic(err) is not None,
                    checkpoint=path, resume=resume_command(self.cfg.run_dir) if path else None))
            raise
        finally:
            self.metrics.close()

    def _attempt(self) -> dict:
        cfg, plan, pools = self.cfg, self.plan, self.pools
        if self.first == 0 and not self._evaluated:  # (again after a failure in the first eval itself)
            with phase(cfg, f"eval before RL ({eval_text(cfg)})"):
                self.out.before(*self.evaluate(), weights=lambda: self.eval_weights(0))
            self._evaluated = True
            if not self.recoveries:
                self.clock.reset()
        timing = f"calibration: timing each operation on the workers ({cfg.tuning.calibration_repeats} repeats)"
        with phase(cfg, timing) if measures(self.run) else nullcontext():
            cost = self._cost = cost_model(self.run, pools, self.out.run_dir if not self.recoveries else None)
        self._attempt_start, self._log_start = self.clock.now(), len(self.timeline.log)
        self.sched = Scheduler(plan, cost=cost, bts_config=cfg.bts_config(), first_step=self.first)
        ex = WorkerExecutor(self.run, pools, self.clock, self.first,
                            (lambda a: None) if self.local else watchdog(self.run, cost, self._observed),
                            self._observed)  # (in-process: no watchdog, the calls run in this thread)
        self.metrics.replay_from(self.first, len(self.recoveries), self._attempt_start)
        cpu0 = time.process_time()
        between = BetweenSteps(self, ex)
        try:
            end, stopped = run_loop(self.sched, ex, self.timeline, between, t0=self._attempt_start), None
        except GuardStopped as g:  # eval.guard_action=stop: the run ends after the step whose eval tripped it
            end, stopped = self.clock.now(), g
        finally:
            between.close()
        self._controller_cpu_s = time.process_time() - cpu0  # the controller's own CPU (scheduler, BTS, calls)
        version = self.sched.published if stopped is None else stopped.version
        if stopped is None:
            with phase(cfg, f"final eval ({eval_text(cfg)})"):
                self.out.after(*self.evaluate(), weights=lambda: self.eval_weights(cfg.steps))
        else:
            self.out.after(stopped.reward, stopped.batch)
        meta = {"steps": str(cfg.steps if stopped is None else version), "version": str(version)}
        self.out.write_checkpoint(self.rank0("checkpoint_bytes", meta))
        return self._finish(end, version)

    def rank0(self, method: str, *args, deadline: float | None = None):
        """The value of a rank-0 call (``WorkerPools.on_rank0``: an eval, a checkpoint), waited for now."""
        refs = self.pools.on_rank0(method, *args)
        return self.pools.get_named(refs, method, deadline or call_deadline(self.cfg))[0].value

    def evaluate(self) -> tuple:
        """(eval reward, eval samples) with rank 0's (EMA) weights: the first ``eval.grid_prompts`` samples, or
        with ``eval.guard`` all of them (the guard scores them)."""
        cfg = self.cfg
        grid = max(cfg.eval.grid_prompts, cfg.eval.num_prompts) if cfg.eval.guard else cfg.eval.grid_prompts
        return self.rank0("evaluate", grid, deadline=call_deadline(cfg) + remote_reward_wait(cfg))  # (it scores)

    def eval_weights(self, step: int) -> bytes:
        """The eval weights as checkpoint bytes (``eval.guard_action=checkpoint`` keeps them)."""
        return self.rank0("checkpoint_bytes", {"steps": str(step), "guard": "pre-divergence"})

    def _finish(self, end: float, version: int) -> dict:
        cfg, plan = self.cfg, self.plan
        if cfg.runtime.checkpoint_every and version > self._last_checkpoint():
            self._save_state(version)  # a finished run can be extended with --resume steps=<more>
        self._merge_stats()
        result = self.timeline.result(self.sched, end)
        result.stats = self.stats
        result.write_trace(self.out.run_dir / "trace.json")
        self._write_observed_profile(result.spans)
        result.write_gantt(self.out.run_dir / "gantt.png", f"{cfg.runtime.mode}: {result.pools_label()}, "
                                                           f"{plan.steps} steps (measured)")
        log = self.timeline.log[self._log_start:]  # the last attempt's
        first_t = log[0][0] if log else 0.0
        events = [ev for ev in self.timeline.events if ev.time >= first_t - 1e-9]
        # the steps done: all, or (ended by eval.guard after its commit) those before the version never published
        violations = [v for v in audit(replace(plan, steps=version), log, events, self.first)
                      if version == plan.steps or v != f"version {version} never published"]
        return self.out.finish(wall_s=self.wall0 + end, version=version, **result.timing(),
                               audit_violations=violations[:20], bts=result.bts,
                               restarts=len(self.recoveries), recoveries=self.recoveries,
                               controller_cpu_s=self._controller_cpu_s, cost_scales=self.sched.cost_scales,
                               clock_error_s=self.pools.clock_error_s,
                               transport="in-process" if self.local else "ray")

    def _write_observed_profile(self, spans) -> None:
        """``profile_observed.json``: the op costs this run's spans showed (``control.observed``), laid over the
        run's calibration curves where it has one (``rescaled_profile``), for planning the next run on the same
        machines. A run too short to show every op kind writes none."""
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
        would not answer (an abort call waited ``WorkerPools.abort``'s 30 s for it before every restart after a
        stall). In-process the next attempt builds new worker objects."""
        detected = self.clock.now()
        self._merge_stats()
        if len(self.recoveries) >= self.cfg.runtime.max_restarts:
            raise e
        step, path = _newest(self.out.run_dir)
        self.first, self.state = (0, None) if path is None else (step, path.read_bytes())
        published = self.stats[self.first - 1].published if self.first else None
        self.recoveries.append({"worker": e.worker, "step": e.step, "action": e.action, "cause": e.cause,
                                "detected_s": detected, "replay_from_step": step_number(self.first),
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
    def _save_state(self, step: int, data: bytes | None = None):
        """Write the resumable checkpoint of ``step`` committed steps (``data``: packed already); its path."""
        if data is None:
            data = self.rank0("pack_state", step, self.counters_now())
        return ckpt.write_checkpoint(self.out.run_dir, step, data, keep=self.cfg.runtime.keep_checkpoints)

    def counters_now(self) -> dict:
        """What a resumable checkpoint keeps of the controller's state: the eval before RL, the wall time so far,
        the outputs' own (the guard's)."""
        return {"eval0": self.out.eval0, "wall_s": self.wall0 + self.clock.now(), **self.out.counters()}

    def _last_checkpoint(self) -> int:
        """The step of the newest checkpoint file (-1: none)."""
        found = ckpt.list_checkpoints(self.out.run_dir)
        return found[-1][0] if found else -1

    def _checkpoint_on_stop(self):
        """After a signal: drop the open step and checkpoint the last committed state (if at a step boundary)."""
        if self.pools is None or self.sched is None:
            return None, ckpt.latest_checkpoint(self.out.run_dir)
        self.pools.abort()
        step = self.sched.train_step
        try:
            if step > self._last_checkpoint():
                self._save_state(step)
        except WorkerFailure:  # mid-step (a minibatch committed) or a dead rank 0: the newest checkpoint stays
            pass
        return _newest(self.out.run_dir)


def _newest(run_dir) -> tuple:
    """(step, path) of the newest resumable checkpoint ((None, None): none)."""
    path = ckpt.latest_checkpoint(run_dir)
    return (None if path is None else ckpt.read_train_state(path).step), path


def _log_failure(cfg: Config, e: WorkerFailure) -> None:
    """Append the error the driver saw from worker ``e.worker`` (with Ray's remote traceback) to that worker's log
    (``run_dir/logs/<worker>.log``): an actor's exception goes back to the caller, not into the worker's output."""
    path = worker_log_dir(cfg) / f"{e.worker}.log"
    if not path.parent.is_dir():
        return
    detail = str(e.__cause__).strip() if e.__cause__ is not None else str(e)
    detail = re.sub(r"\x1b\[[0-9;]*m", "", detail)  # (Ray colours the task's name)
    try:
        with path.open("a") as f:
            f.write(f"[digenrl] {datetime.now().isoformat(timespec='seconds')} the driver saw: {e}\n{detail}\n")
    except OSError:
        pass  # a full disk: the failure line says it all


def _on_worker(e, worker: str):
    """``e`` (a worker's ``RunHalted``) with the worker named in its message."""
    try:
        return type(e)(f"{e} (on worker {worker})")
    except Exception:  # a subclass with another signature: keep it as it came
        return e


__all__ = ["run_training", "uses_ray"]
