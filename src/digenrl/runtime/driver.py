"""``run_disaggregated(cfg)``: the controller of a Ray run; the same run outputs as ``train.loop.run_training``.

The controller runs ``digenrl.control.loop.run_loop`` (the simulator's control loop) with the ``RayExecutor``;
it moves object refs, never tensors. After each commit it may ask trainer rank 0 for an eval (``eval.every``)
or a checkpoint (``runtime.checkpoint_every``; always at the end), written atomically. On a worker failure
the open transactions are aborted and ``WorkerFailure`` (worker, step) is raised: nothing of the failed step
is committed, and the last checkpoint on disk is the last one written after a commit.

Besides the reference loop's outputs a run writes ``trace.json`` / ``gantt.png`` (``control.timeline``),
``trajectories.jsonl`` (``step_metrics``), ``profile.json`` (the measured costs BTS used, TAG modes) and, when
a worker failed, ``failure.json``.
"""

from __future__ import annotations

from digenrl.config import Config
from digenrl.control.loop import Completion, run_loop
from digenrl.control.run_plan import RunPlan, plan_run
from digenrl.control.timeline import Timeline
from digenrl.observe.run_outputs import RunOutputs
from digenrl.schedule import Commit, Scheduler

from .cluster import ActorPools, get_named, ray_session, start_pools
from .errors import WorkerFailure
from .executor import Clock, RayExecutor
from .step_metrics import StepMetrics


def run_disaggregated(cfg: Config) -> dict:
    """Train with the Ray runtime (``runtime.mode``); writes every run output into ``cfg.run_dir``."""
    run = plan_run(cfg)  # config errors before anything is written or started
    with ray_session(run):  # placement errors too
        out, pools = RunOutputs(cfg), None
        try:
            pools = start_pools(run)
            return _run(run, pools, out)
        except WorkerFailure as e:
            if pools is not None:
                _abort(pools)
            out.failure({"worker": e.worker, "step": e.step, "action": e.action, "error": str(e)})
            raise
        finally:
            if pools is not None:
                pools.kill()
            out.close()


def _run(run: RunPlan, pools: ActorPools, out: RunOutputs) -> dict:
    from .calibrate import cost_model

    cfg, plan = run.cfg, run.plan
    sched = Scheduler(plan, cost=cost_model(run, pools, out.run_dir))
    out.before(*_eval(pools, plan, cfg.eval.grid_prompts))
    clock = Clock()
    ex, timeline, metrics = RayExecutor(run, pools, clock), Timeline(plan), StepMetrics(plan, out.run_dir)
    try:
        wall = run_loop(sched, ex, timeline, _BetweenSteps(cfg, pools, ex, out, metrics, timeline))
    finally:
        metrics.close()
    out.after(*_eval(pools, plan, cfg.eval.grid_prompts))
    meta = {"steps": str(cfg.steps), "version": str(sched.published)}
    out.write_checkpoint(get_named({plan.trainers[0]: pools.rank0.checkpoint_bytes.remote(meta)},
                                   "checkpoint")[0].value)
    from digenrl.schedule.audit import audit

    result = timeline.result(sched, wall)
    result.write_trace(out.run_dir / "trace.json")
    result.write_gantt(out.run_dir / "gantt.png", f"{cfg.runtime.mode}: {result.pools_label()}, {plan.steps} steps "
                                                  f"(measured)")
    return out.finish(wall_s=wall, version=sched.published, **result.timing(),
                      audit_violations=audit(plan, timeline.log, timeline.events)[:20], bts=result.bts)


def _eval(pools: ActorPools, plan, grid: int):
    """(eval reward, the first ``grid`` eval samples) with rank 0's (EMA) weights."""
    return get_named({plan.trainers[0]: pools.rank0.evaluate.remote(grid)}, "eval")[0].value


class _BetweenSteps:
    """The control loop's observer in a Ray run: step metrics, and evals / checkpoints between steps, on
    trainer rank 0 and off the schedule."""

    def __init__(self, cfg: Config, pools: ActorPools, ex: RayExecutor, out: RunOutputs, metrics: StepMetrics,
                 timeline: Timeline):
        self.cfg, self.pools, self.ex, self.out, self.metrics, self.timeline = cfg, pools, ex, out, metrics, timeline
        self._evals: dict[int, float | None] = {}   # version -> eval reward (None: requested, not back yet)
        self._rows: list[dict] = []

    def on_completion(self, c: Completion) -> None:
        self.metrics.record(c)
        if c.side == "eval":
            self._evals[c.step] = c.results[0].value[0]
        elif c.side == "checkpoint":
            self.out.write_checkpoint(c.results[0].value)
        elif isinstance(c.action, Commit):
            self._after_commit(c.action.step + 1)

    def _after_commit(self, version: int) -> None:
        cfg, rank0 = self.cfg, next(iter(self.pools.trainers))
        if cfg.eval.every and version % cfg.eval.every == 0 and version < cfg.steps:
            self._evals[version] = None
            self.ex.side(rank0, self.pools.rank0.evaluate.remote(0), "eval", version)
        every = cfg.runtime.checkpoint_every
        if every and version % every == 0 and version < cfg.steps:
            ref = self.pools.rank0.checkpoint_bytes.remote({"steps": str(version), "version": str(version)})
            self.ex.side(rank0, ref, "checkpoint", version)

    def after_wait(self) -> None:
        """Write rows in step order; a row whose eval is still running waits for it."""
        self._rows.extend(self.metrics.rows_ready(self.timeline.spans))
        while self._rows:
            step = self._rows[0]["step"]
            if step in self._evals:
                if self._evals[step] is None:
                    return
                self._rows[0]["eval_reward"] = self._evals.pop(step)
            self.out.log(self._rows.pop(0))


def _abort(pools: ActorPools, timeout_s: float = 30.0) -> None:
    """Drop every open transaction on the trainers still alive (best effort: the actors are killed next)."""
    import ray

    refs = [t.abort.remote() for t in pools.trainers.values()]
    ray.wait(refs, num_returns=len(refs), timeout=timeout_s)


__all__ = ["run_disaggregated"]
