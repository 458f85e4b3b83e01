"""A test helper (no product code uses it): any cost model sampled into a measured-profile ``ProfileCost``, e.g.
a roofline priced as a profile (imported by name: pytest puts ``tests/`` on sys.path)."""

from __future__ import annotations

from typing import Iterable

from digenrl.control.profile import Curve, ProfileCost
from digenrl.schedule.cost import OPS, POOLS, CostModel


def tabulate(cost: CostModel, batches: Iterable[int] = (1, 2, 4, 8, 16), source: str = "") -> ProfileCost:
    """Sample any cost model into a profile (per pool), e.g. to save a roofline as a starting profile."""
    bs = sorted(set(batches))
    curves = {}
    for pool in POOLS:
        for op in OPS:
            pts = [1] if op in ("allreduce", "optimizer", "publish", "tag_switch") else bs
            curves[f"{pool}/{op}"] = Curve(tuple(float(b) for b in pts),
                                           tuple(cost.time(op, b, pool) for b in pts))
    return ProfileCost(curves, source)
