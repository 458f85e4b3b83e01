"""The product's steps in this process, without a run directory: the scheduler, the control loop, the worker
executor and the in-process workers (``runtime.local``) of ``digenrl train``, for tests that look at the trainer's
state after some steps (its weights, optimizer, EMA) or at the step metrics (imported by name: pytest puts
``tests/`` on sys.path)."""

from __future__ import annotations


def product_worker(cfg, *, policy=None, reward=None, task=None):
    """The colocated trainer worker of ``cfg`` built in this process; ``policy`` / ``reward`` / ``task``: objects it
    uses instead of the config's (its context is built with them)."""
    from digenrl.runtime.local import colocated_worker

    return colocated_worker(cfg, policy=policy, reward=reward, task=task)


def product_steps(cfg, *, policy=None, reward=None, task=None, steps: int | None = None, first: int = 0,
                  worker=None, state: bytes | None = None):
    """(the trainer worker after ``steps`` (default ``cfg.steps``) steps from ``first``, the steps' metric rows).
    ``policy`` / ``reward`` / ``task``: as ``product_worker``; ``worker``: a worker to go on with (its weights are
    step ``first``'s); ``state``: a resumable checkpoint's bytes the worker restores first (``first`` becomes its
    step)."""
    from digenrl.runtime.local import run_steps

    worker = worker or product_worker(cfg, policy=policy, reward=reward, task=task)
    return worker, run_steps(cfg, worker, first=first, steps=steps, state=state)
