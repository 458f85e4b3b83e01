"""A trainer pool's collective calls that time out name who waited, on which rank, in which call.

The torch.distributed groups wait ``runtime.collective_timeout_s`` for the other ranks; gloo then raises a bare
``RuntimeError`` (``... Timed out waiting ...``). ``collective_action`` turns that, inside a decorated call of a
pool of several ranks, into a ``CollectiveTimeout`` naming the worker, its rank and the call with its small
arguments; every other error passes unchanged (under NCCL the watchdog aborts the process instead).
"""

from __future__ import annotations

import functools
import inspect
import re

from digenrl.schedule import step_number


class CollectiveTimeout(RuntimeError):
    """A collective of the trainer pool waited longer than ``runtime.collective_timeout_s``."""


def _describe(fn, args: tuple, kwargs: dict) -> str:
    """``train(chunk=step 3 group 1 round 0, 8 cells)``: the call with its small arguments (steps numbered as a
    person reads them: ``schedule.step_number``)."""
    parts = []
    for k, v in list(inspect.signature(fn).bind(None, *args, **kwargs).arguments.items())[1:]:
        if hasattr(v, "step") and hasattr(v, "group"):  # a chunk or a fragment
            size = f", {len(v.cells)} cells" if hasattr(v, "cells") else f", {len(v.generations)} generations"
            parts.append(f"{k}=step {step_number(v.step)} group {v.group}"
                         + (f" round {v.round}" if hasattr(v, "round") else "") + size)
        elif k == "step" and isinstance(v, int) and not isinstance(v, bool):
            parts.append(f"step={step_number(v)}")
        elif isinstance(v, (bool, int, float, str)):
            parts.append(f"{k}={v!r}")
    return f"{fn.__name__}({', '.join(parts)})"


def collective_action(fn):
    """Decorator of the calls that are collectives of a pool of several ranks: a timed-out collective inside
    ``fn`` (gloo raises ``RuntimeError: ... Timed out waiting ...``) becomes a ``CollectiveTimeout`` naming the
    worker, its rank and the call; every other error passes unchanged."""

    @functools.wraps(fn)
    def call(self, *args, **kwargs):
        try:
            return fn(self, *args, **kwargs)
        except RuntimeError as e:
            if self._world < 2 or isinstance(e, CollectiveTimeout) or not re.search(r"timed? ?out", str(e), re.I):
                raise
            raise CollectiveTimeout(
                f"{self.name} (trainer rank {self.rank} of {self._world}): {_describe(fn, args, kwargs)} waited "
                f"longer than runtime.collective_timeout_s = {self.cfg.runtime.collective_timeout_s:g} s in a "
                f"collective that another rank of the pool did not join: {e}") from e

    return call
