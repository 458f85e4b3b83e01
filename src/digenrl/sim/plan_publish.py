"""The publish path and the stale hold of ``digenrl plan``, searched on the plan the split search chose.

Publish path (``runtime.publish``; a disaggregated mode priced on a roofline ``--testbed``): the split search
(``plan_search.search``) runs with the config's own path. The plan it chose is then probed with each other path,
priced by the roofline (``sim.roofline``: rank 0's object-store copy after the shard group's gather, a broadcast the
generators join, or every rank's shard streamed while the trainers go on). Where another path is faster
there by more than ``PATH_MARGIN`` (1 %), the whole search runs again with that path (the split, fragment size and
chunk shape that suit one path may not suit another), and that search is the plan when it is faster than the first
by more than the margin too. The margin keeps the config's path (by default the object store, which needs no
process group across the pools) where another is faster only within the cost model's own error. A measured profile
prices only the path it was measured with, so with ``--profile`` the config's path stays and the report says so.

Stale hold (``runtime.stale_hold``; ``full`` with a publish the generators join: ``schedule.stale_hold.applies``):
the chosen plan is probed with h in {the config's own h, 0} and ``sim.planner.STALE_HOLDS``, and the fastest is
kept (ties: the config's own h, then the smaller), as ``digenrl simulate``'s planner does
(``planner.best_stale_hold``). The hold only moves when a generator starts a stale fragment; it computes the same.

The robustness report is recomputed for the final plan.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ..schedule import Mode
from ..schedule import stale_hold as stale_rule
from .executor import steady_step_time
from .plan_search import Candidate, Probe, SearchResult, candidate_plan, fitted, robustness
from .planner import STALE_HOLDS
from .presets import PUBLISH_PATHS


# a publish path other than the config's must be faster than it by more than this share (of the step time) to be
# chosen: the roofline prices the publish from bandwidths alone, so a smaller gain is within its error
PATH_MARGIN = 0.01


def with_publish(cfg, path: str):
    """``cfg`` with ``runtime.publish = path``."""
    return cfg.model_copy(update={"runtime": cfg.runtime.model_copy(update={"publish": path})})


def _probe(cfg, c: Candidate, cost, fit: Callable | None, probe_steps: int) -> float | None:
    """The steady step time of candidate ``c`` of ``cfg`` at ``cost``; None where it does not fit."""
    plan = candidate_plan(cfg, c, fit)
    return None if plan is None else steady_step_time(replace(plan, steps=probe_steps), cost)


def refine(cfg, res: SearchResult, *, search_with: Callable[[object], SearchResult],
           costs_with: Callable[[object], Callable] | None, fit: Callable | None = None,
           probe_steps: int = 4) -> SearchResult:
    """``res`` (the split search of ``cfg``) with the publish path and the stale hold searched (module docstring).

    ``search_with(cfg)``: the split search of a config; ``costs_with(cfg)``: the ``cost_of(n_gen, n_train)`` of a
    config (roofline, which prices its publish path), or None (a measured profile: the path is not searched).
    ``res.publish`` records what was tried: ``{"path", "searched", "paths_s", "searched_again_s", "hold",
    "holds_s"}`` (``paths_s``: each path on the first search's plan)."""
    mode = Mode(cfg.runtime.mode)
    if not mode.disaggregated:
        return res
    own = cfg.runtime.publish
    first = res.best.candidate
    times = {own: res.best.step_time}
    if costs_with is not None:
        for path in (p for p in PUBLISH_PATHS if p != own):
            other = with_publish(cfg, path)
            cost = costs_with(other)(first.n_gen, first.n_train)
            t = None if isinstance(cost, str) else _probe(other, first, cost, fit, probe_steps)
            if t is not None:
                times[path] = t
    path = min(times, key=lambda p: (times[p], p != own))
    report: dict = {"searched": costs_with is not None, "paths_s": times, "margin": PATH_MARGIN}
    if times[path] < (1 - PATH_MARGIN) * times[own]:
        again = search_with(with_publish(cfg, path))
        report["searched_again_s"] = {own: res.best.step_time, path: again.best.step_time}
        if again.best.step_time < (1 - PATH_MARGIN) * res.best.step_time:
            res = again
        else:
            path = own
    else:
        path = own
    cfg = with_publish(cfg, path)
    best = res.best = replace(res.best, candidate=replace(res.best.candidate, publish=path))
    report.update(path=path, hold=cfg.runtime.stale_hold, holds_s={})
    cost = res.costs[(best.candidate.n_gen, best.candidate.n_train)]
    if stale_rule.applies(replace(best.plan, stale_hold=1.0)):
        own_h = cfg.runtime.stale_hold
        probes = {own_h: best}
        for h in sorted({0.0, *STALE_HOLDS} - {own_h}):  # the hold changes no memory: the plan with another h
            plan = replace(best.plan, stale_hold=h)
            t = steady_step_time(replace(plan, steps=probe_steps), cost)
            probes[h] = Probe(replace(best.candidate, stale_hold=h), plan, t, len(res.probes) + len(probes) - 1)
        h = min(probes, key=lambda x: (probes[x].step_time, x != own_h, x))
        if h != own_h:
            res.probes.append(probes[h])
            res.best = probes[h]
        report.update(hold=h, holds_s={x: p.step_time for x, p in probes.items()})
    res.publish = report
    res.config = fitted(cfg, res.best.candidate, fit)
    if res.robustness:
        res.robustness = robustness(res, res.costs, probe_steps)
    return res


__all__ = ["refine", "with_publish"]
