"""The shard-group count of ``digenrl plan`` (hybrid sharding, ``train.shard_groups``), searched with the split.

A sharded trainer pool (``train.sharding: fsdp``) under TSP is k shard groups of N / k ranks each, data-parallel
replicas that train chunks side by side; the commit all-reduces the gradient shards across them (``sim.roofline``
prices that, and each group's own gathers and memory). ``sim.plan_setting.choose`` gives every k <=
``planner.MAX_SHARD_GROUPS`` that leaves groups of at least 2 ranks at some split (as ``digenrl simulate``'s
planner tries: ``planner.group_options``) a split search of its own, in which the roofline refuses the splits
whose trainer ranks k does not divide; the fastest k is kept where it beats the config's own by more than
``MARGIN`` (1 %).

Not searched: without TSP, for a colocated mode (priced as the idealised colocated FSDP bound), without sharding, and with
``--profile`` (a profile prices only the pool it was measured on); the config's k stays and the report says so.
This runs before the publish path's search, which then runs at the chosen k (the stream's cost depends on it).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ..schedule import Mode
from .plan_search import SearchResult, fitted
from .plan_setting import MARGIN, choose
from .planner import MAX_SHARD_GROUPS


def with_groups(cfg, k: int):
    """``cfg`` with ``train.shard_groups = k``; where k does not divide its trainer ranks, with the most trainer
    ranks of its pools that k divides (a valid config to start a split search from: the search sets the pools of
    every candidate)."""
    rt = cfg.runtime
    update = {}
    if rt.trainers % k:
        workers = rt.generators + rt.trainers
        trainers = max(k, (rt.trainers // k) * k)
        update = {"trainers": trainers, "generators": max(1, workers - trainers)}
    return cfg.model_copy(update={"train": cfg.train.model_copy(update={"shard_groups": k}),
                                  "runtime": rt.model_copy(update=update)})


def options(workers: int) -> list[int]:
    """The k worth a search on ``workers`` workers: groups of at least 2 ranks at the largest trainer pool (a
    disaggregated mode keeps a generator, so at most ``workers - 1`` trainer ranks)."""
    return [k for k in range(1, MAX_SHARD_GROUPS + 1) if 2 * k <= workers - 1]


def applies(cfg) -> bool:
    """k is searched: a disaggregated TSP mode with a sharded trainer pool."""
    mode = Mode(cfg.runtime.mode)
    return mode.disaggregated and mode.tsp and cfg.train.sharding == "fsdp"


def refine_groups(cfg, res: SearchResult, *, search_with: Callable[[object], SearchResult],
                  costs_with: Callable[[object], Callable] | None,
                  fit: Callable | None = None) -> tuple[object, SearchResult]:
    """(``cfg`` with the chosen k, the search result that goes with it); ``res`` is the split search of ``cfg``,
    ``search_with(cfg)`` that of a config, ``costs_with``: None with a measured profile (k is not searched).
    ``res.groups`` records what was tried: ``{"searched", "groups": k, "times_s": {k: its search's step time},
    "margin", "refused": {k: why}}``; empty where k is not searched at all (``applies``)."""
    if not applies(cfg):
        return cfg, res
    k = cfg.train.shard_groups
    report: dict = {"searched": False, "times_s": {k: res.best.step_time}, "margin": MARGIN}
    if costs_with is not None:
        k, res, tried = choose(cfg, res, k, options(res.workers), with_groups, search_with=search_with)
        report.update(searched=True, **tried)
    cfg = with_groups(cfg, k)
    res.best = replace(res.best, candidate=replace(res.best.candidate, shard_groups=k))
    report["groups"] = k
    res.groups = report
    res.config = fitted(cfg, res.best.candidate, fit)
    return cfg, res


__all__ = ["applies", "options", "refine_groups", "with_groups"]
