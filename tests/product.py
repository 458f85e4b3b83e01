"""The product's steps in this process, without a run directory: the scheduler, the control loop, the worker
executor and the in-process workers (``runtime.local``) of ``digenrl train``, for tests that look at the trainer's
state after some steps (its weights, optimizer, EMA) or at the step metrics (imported by name: pytest puts
``tests/`` on sys.path)."""

from __future__ import annotations


def product_worker(cfg, *, policy=None, reward=None, task=None):
    """The colocated trainer worker of ``cfg`` built in this process; ``policy`` / ``reward`` / ``task``: objects it
    uses instead of the config's (its context is built with them)."""
    from digenrl.runtime.trainer import TrainerWorker

    worker = TrainerWorker("col0", cfg.model_dump(mode="json"), 0)
    if policy is not None or reward is not None or task is not None:
        from digenrl.train.context import build_context

        worker.ctx = build_context(cfg, policy=policy, reward=reward, task=task)
        worker.task, worker.reward, worker.sampler = worker.ctx.task, worker.ctx.reward, worker.ctx.sampler
        worker.tx = worker.ctx.transaction
    return worker


def product_steps(cfg, *, policy=None, reward=None, task=None, steps: int | None = None, first: int = 0,
                  worker=None, state: bytes | None = None):
    """(the trainer worker after ``steps`` (default ``cfg.steps``) steps from ``first``, the steps' metric rows).
    ``policy`` / ``reward`` / ``task``: as ``product_worker``; ``worker``: a worker to go on with (its weights are
    step ``first``'s); ``state``: a resumable checkpoint's bytes the worker restores first (``first`` becomes its
    step)."""
    from dataclasses import replace

    from digenrl.control.loop import run_loop
    from digenrl.control.run_plan import plan_run
    from digenrl.control.timeline import Timeline
    from digenrl.runtime.clocks import Clock
    from digenrl.runtime.cluster import ready_pools
    from digenrl.runtime.executor import WorkerExecutor
    from digenrl.runtime.local import LocalPools
    from digenrl.runtime.step_metrics import StepMetrics
    from digenrl.schedule import Scheduler

    run = plan_run(cfg)
    assert not run.generator_ids and run.trainer_ids == ("col0",), "one colocated worker"
    worker = worker or product_worker(cfg, policy=policy, reward=reward, task=task)
    pools = LocalPools({}, {"col0": worker})
    ready_pools(run, pools, state)
    if state is not None:
        first = worker.tx.version
    end = first + (cfg.steps if steps is None else steps)
    plan = replace(run.plan, steps=end)
    clock, timeline, metrics = Clock(), Timeline(plan), StepMetrics(plan)
    clock.use(pools.clock_offsets)
    metrics.replay_from(first, 0, 0.0)
    rows = []

    class Observer:
        def on_completion(self, c):
            metrics.record(c)

        def after_wait(self):
            rows.extend(metrics.rows_ready(timeline.spans))

    run_loop(Scheduler(plan, first_step=first), WorkerExecutor(run, pools, clock, first), timeline, Observer())
    return worker, rows
