"""Faults that stop a run because going on would destroy its model.

``RunHalted`` is raised where a bad value would enter the weights: a reward function's output that is not one
finite float score per sample (``rewards.base``), a commit whose loss or gradient norm is not finite
(``train.transaction``; the optimizer is not stepped). A restart cannot help (the replay computes the same
values), so the Ray controller does not recover from it; ``digenrl train`` writes ``failure.json`` (the last
good resumable checkpoint stays, no checkpoint of the bad weights is written) and exits with code 2.
"""

from __future__ import annotations


class RunHalted(RuntimeError):
    """A run stopped on a value that would corrupt the model; the message names the step and the cause."""


def find_halted(e: BaseException | None) -> RunHalted | None:
    """The ``RunHalted`` behind ``e`` (its cause chain, or a Ray task error's ``cause``), if there is one."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        inner = getattr(e, "cause", None)  # ray.exceptions.RayTaskError keeps the worker's exception here
        if isinstance(inner, RunHalted):
            return inner
        if isinstance(e, RunHalted) and type(e).__module__.startswith("digenrl"):
            return e
        e = e.__cause__ or (inner if isinstance(inner, BaseException) else None)
    return None
