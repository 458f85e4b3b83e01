"""Errors of the runtime."""

from __future__ import annotations


class WorkerFailure(RuntimeError):
    """A worker raised or died; the run stopped without committing a partial step.

    ``worker``: the worker id (e.g. ``gen0``, ``trn1``); ``step``: the step of the work it was doing, as a person
    reads it (``schedule.step_number``: from 1, as the progress line; an eval or checkpoint between steps: the
    step it follows); ``action``: a short description of that work.
    """

    def __init__(self, worker: str, step: int | None, action: str, cause: str):
        self.worker, self.step, self.action, self.cause = worker, step, action, cause
        where = f"at step {step}" if step is not None else "outside a step"
        super().__init__(f"worker {worker} failed {where} during {action}: {cause}")
