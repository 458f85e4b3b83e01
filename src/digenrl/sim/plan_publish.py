"""The publish path and the stale hold of ``digenrl plan``.

Publish path (``runtime.publish``; a disaggregated mode priced on a roofline ``--testbed``): chosen by
``sim.plan_setting.choose`` among the three paths, each with a split search of its own priced by the roofline
(``sim.roofline``: rank 0's object-store copy after the shard group's gather, a broadcast the generators join, or
every rank's shard streamed while the trainers go on). Another path must beat the config's own (by default the
object store, which needs no process group across the pools) by more than ``PATH_MARGIN`` (1 %). A measured profile
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
from .plan_search import Probe, SearchResult, fitted, robustness
from .plan_setting import MARGIN, choose
from .planner import STALE_HOLDS
from .presets import PUBLISH_PATHS

PATH_MARGIN = MARGIN  # a path other than the config's must be faster by more than this share of the step time


def with_publish(cfg, path: str):
    """``cfg`` with ``runtime.publish = path``."""
    return cfg.model_copy(update={"runtime": cfg.runtime.model_copy(update={"publish": path})})


def refine(cfg, res: SearchResult, *, search_with: Callable[[object], SearchResult],
           costs_with: Callable[[object], Callable] | None, fit: Callable | None = None,
           probe_steps: int = 4) -> SearchResult:
    """``res`` (the split search of ``cfg``) with the publish path and the stale hold searched (module docstring).

    ``search_with(cfg)``: the split search of a config; ``costs_with(cfg)``: the ``cost_of(n_gen, n_train)`` of a
    config (roofline, which prices its publish path), or None (a measured profile: the path is not searched).
    ``res.publish`` records what was tried: ``{"path", "searched", "paths_s", "margin", "refused", "hold",
    "holds_s"}`` (``paths_s``: each path's own search; ``holds_s``: each h on the chosen plan)."""
    mode = Mode(cfg.runtime.mode)
    if not mode.disaggregated:
        return res
    path = cfg.runtime.publish
    report: dict = {"searched": False, "paths_s": {path: res.best.step_time}, "margin": PATH_MARGIN}
    if costs_with is not None:
        before = res
        path, res, tried = choose(cfg, res, path, PUBLISH_PATHS, with_publish, search_with=search_with,
                                  margin=PATH_MARGIN)
        report.update(searched=True, paths_s=tried.pop("times_s"), **tried)
        if res is not before:  # another path's own search: it ran at the shard groups chosen before it
            res.groups = before.groups
            res.best = replace(res.best, candidate=replace(res.best.candidate,
                                                           shard_groups=before.best.candidate.shard_groups))
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
