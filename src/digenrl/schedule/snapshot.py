"""The scheduler's state as BTS and the stale hold see it: a ``bts_model.Snapshot`` of the training step at ``t``."""

from __future__ import annotations

from collections import deque
from itertools import groupby

from .actions import Action, Generate
from .bts_model import Snapshot
from .cost import Durations
from .layout import Chunk
from .plan import StepPlan
from .step_work import StepWork


def take_snapshot(plan: StepPlan, dur: Durations, t: float, step: int, busy: dict[str, tuple[Action, float] | None],
                  last_gen: dict[str, bool], ready: deque[Chunk], work: StepWork) -> Snapshot:
    """The ``Snapshot`` of training step ``step`` at ``t``. ``busy``: worker -> (action, launch time) or None; a
    predicted end is never before ``t`` (real work can overrun its estimate)."""
    gens = []
    for w in plan.generators:
        cur = busy[w]
        if cur is None:
            gens.append((t, -1))
        else:
            act, t0 = cur
            gens.append((max(t, t0 + dur.of(act)), act.fragment.group if act.fragment.step == step else -1))
    ranks, idle = [], []
    for i, r in enumerate(plan.trainers):
        cur = busy[r]
        if cur is None:
            ranks.append((t, (), last_gen[r]))
            idle.append(i)
        else:
            act, t0 = cur
            gen = isinstance(act, Generate)
            ranks.append((max(t, t0 + dur.of(act)), tuple(f.group for f in act.fragments) if gen else (), gen))
    runs = [len(list(run)) for _, run in groupby(ready, key=lambda c: c.group)]
    incomplete = tuple(g for g in range(plan.prompts) if work.outstanding.get(g, 0) > 0)
    pending = tuple((f.group, f.size) for f in work.pending)
    return Snapshot(t, step, pending, tuple(gens), tuple(ranks), tuple(idle), tuple(runs), incomplete)
