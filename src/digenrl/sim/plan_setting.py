"""One config-wide setting of ``digenrl plan`` searched together with the split: the publish path
(``sim.plan_publish``) and the shard-group count of a sharded trainer pool (``sim.plan_groups``).

Each value of the setting gets a split search of its own (``plan_search.search`` of the config with that value:
every split, fragment size, chunk shape and stale cap, priced by its own roofline cost model), so a value that
wins only at another split than the config's own value's plan is found. The fastest value is kept where it beats
the config's own by more than ``MARGIN`` (1 % of the step time); else the config's own value stays. The margin
keeps the config's value where another is faster only within the cost model's own error (the roofline prices
these settings from bandwidths alone). A value none of whose splits can be priced (memory, group sizes) is
reported with the reason.
"""

from __future__ import annotations

from typing import Callable, Hashable, Iterable

from .plan_search import INDIVISIBLE, PlanSearchError, SearchResult

MARGIN = 0.01  # another value must beat the config's own by more than this share of the step time


def choose(cfg, res: SearchResult, own: Hashable, values: Iterable[Hashable], variant: Callable, *,
           search_with: Callable[[object], SearchResult],
           margin: float = MARGIN) -> tuple[Hashable, SearchResult, dict]:
    """(the value, its search result, what was tried) for one setting (module docstring).

    ``res``: the split search of ``cfg``, whose value is ``own``; ``variant(cfg, v)``: ``cfg`` with the setting at
    ``v``; ``search_with(cfg)``: the split search of a config. The record: ``{"times_s": {value: its search's step
    time}, "margin", "refused": {value: why no split of it can be priced}}`` (``refused`` only where one was)."""
    found, refused = {own: res}, {}
    for v in values:
        if v != own:
            try:
                found[v] = search_with(variant(cfg, v))
            except PlanSearchError as e:
                refused[v] = _short(e)
    times = {v: r.best.step_time for v, r in found.items()}
    best = min(times, key=lambda v: (times[v], v != own))
    report: dict = {"times_s": times, "margin": margin}
    if refused:
        report["refused"] = refused
    if times[best] < (1 - margin) * times[own]:
        return best, found[best], report
    return own, res, report


def _short(e: PlanSearchError) -> str:
    """A search's refusal with one split's reason only: the first that is not a shard-group count dividing no
    trainer pool of that split (the splits it does divide say what stops the value), else the first."""
    if not e.refused:
        return str(e)
    head = str(e).partition(" (")[0]
    skip = INDIVISIBLE.split("{", 1)[0]
    split, why = next(((k, r) for k, r in e.refused.items() if not r.startswith(skip)), next(iter(e.refused.items())))
    more = len(e.refused) - 1
    return f"{head} ({split}: {why}" + (f"; and {more} more)" if more else ")")


__all__ = ["MARGIN", "choose"]
