"""``run_disaggregated(cfg)``: the controller of a Ray run; the same run outputs as ``train.loop.run_training``.

The controller runs ``digenrl.schedule.Scheduler`` (the simulator's state machine) and is the only place that
turns its actions into actor calls and completions into events; it moves object refs, never tensors.
After each commit it may ask trainer rank 0 for an eval (``eval.every``) or a checkpoint
(``runtime.checkpoint_every``; always at the end), written atomically (tmp file + rename). On a worker failure
the open transactions are aborted and ``WorkerFailure`` (worker, step) is raised: nothing of the failed step
is committed, and the last checkpoint on disk is the last one written after a commit.
"""

from __future__ import annotations

from digenrl.config import Config
from digenrl.schedule import Committed, Scheduler

from .cluster import Pools, check_resources, ray_session, start_pools
from .errors import WorkerFailure
from .executor import ActionExecutor, Clock
from .outputs import RunOutputs
from .records import RunRecorder
from .setup import RuntimeSetup, runtime_plan


def run_disaggregated(cfg: Config) -> dict:
    """Train with the Ray runtime (``runtime.mode``); writes every run output into ``cfg.run_dir``."""
    import ray

    setup = runtime_plan(cfg)  # config errors before anything is written or started
    with ray_session(setup):
        check_resources(setup, ray.cluster_resources())  # placement errors before anything is written
        out, pools = RunOutputs(cfg), None
        try:
            pools = start_pools(setup)
            return _run(setup, pools, out)
        except WorkerFailure as e:
            if pools is not None:
                _abort(pools)
            out.failure(e)
            raise
        finally:
            if pools is not None:
                pools.kill()
            out.close()


def _run(setup: RuntimeSetup, pools: Pools, out: RunOutputs) -> dict:
    from .profile import cost_model

    cfg, plan = setup.cfg, setup.plan
    sched = Scheduler(plan, cost=cost_model(setup, pools, out.run_dir))
    clock = Clock()
    ex, rec = ActionExecutor(setup, pools, clock), RunRecorder(plan, clock, out.run_dir)
    out.eval_before(pools)
    clock.reset()
    ex.launch(rec.launched(sched.start(0.0), 0.0), 0.0)
    while not sched.done:                              # the control loop: completions -> events -> actions
        for call in ex.wait():
            rec.record(call)
            if call.event is None:                     # eval / checkpoint from between the steps
                out.side_result(call)
                continue
            ev = call.event
            ex.launch(rec.launched(sched.on_event(ev), ev.time), ev.time)
            if isinstance(ev, Committed):
                _between_steps(ev.step + 1, cfg, pools, ex, out)
        out.log_rows(rec.rows_ready())
    wall = clock.now()
    while not ex.idle:                                 # evals / checkpoints still in flight
        for call in ex.wait():
            rec.record(call)
            out.side_result(call)
    out.log_rows([])
    return out.finish(setup, pools, sched, rec, wall)


def _between_steps(version: int, cfg: Config, pools: Pools, ex: ActionExecutor, out: RunOutputs) -> None:
    """After a commit (weights are now ``version``): eval / checkpoint on trainer rank 0, off the schedule."""
    rank0 = next(iter(pools.trainers))
    if cfg.eval.every and version % cfg.eval.every == 0 and version < cfg.steps:
        out.expect_eval(version)
        ex.side(rank0, pools.rank0.evaluate.remote(0), "eval", version)
    every = cfg.runtime.checkpoint_every
    if every and version % every == 0 and version < cfg.steps:
        ref = pools.rank0.checkpoint_bytes.remote({"steps": str(version), "version": str(version)})
        ex.side(rank0, ref, "checkpoint", version)


def _abort(pools: Pools, timeout_s: float = 30.0) -> None:
    """Drop every open transaction on the trainers still alive (best effort: the actors are killed next)."""
    import ray

    refs = [t.abort.remote() for t in pools.trainers.values()]
    ray.wait(refs, num_returns=len(refs), timeout=timeout_s)


__all__ = ["run_disaggregated"]
