"""TAG decision policies: who decides how many pending fragments go to idle trainer ranks at a bubble.

The scheduler asks one policy at every bubble (a trainer rank is about to idle while fragments of the current
step are pending; ``Scheduler._bubble``) and hands the next k pending fragments to k idle ranks
(``bts_model.tag_targets``). Policies, by ``BTSConfig.policy``:

* ``bts``: the recursive search (``bts.BTS``), never predicted slower than k = 0 with exact costs;
* ``greedy``: one fragment per idle trainer rank while fragments are pending, k = min(idle, pending), with no
  prediction (the baseline a search has to beat);
* ``none``: k = 0 at every bubble (the TAG mode then runs exactly like its mode without TAG);
* ``auto`` (the default): ``greedy`` in ``full`` (TCSS), ``bts`` otherwise (``resolved_policy``).

Why ``auto`` (``benchmarks/bts_quality.py``, docs/simulation.md "BTS decision quality"): over the simulator's
preset configurations, BTS depth 2 was on average faster than greedy in ``gap_tsp_tag`` under every cost
jitter, and in ``full`` slower on the mean of the jitter levels (not at every level, and by a fraction of a
percent: the page's per-mode table). BTS's objective ends at the current step's commit. With TCSS, the sooner the
rollout of the current step ends, the sooner the generators start the next step's fragments, and greedy's
larger k gains that time where BTS does not see it.

All three go through the same scheduler code path and keep the same statistics (``BTSStats``); only ``bts``
predicts commit times (greedy and none record no prediction).
"""

from __future__ import annotations

import time
from typing import Callable

from .bts import BTS, BTSConfig, BTSStats, Decision
from .bts_model import Snapshot
from .cost import CostModel
from .plan import Mode, StepPlan


class FixedRule:
    """A rule without search: ``greedy`` (k = min(idle, pending)) or ``none`` (k = 0)."""

    def __init__(self, greedy: bool, clock: Callable[[], float] = time.perf_counter):
        self.greedy = greedy
        self.clock = clock
        self.stats = BTSStats()

    def decide(self, snap: Snapshot) -> Decision:
        t0 = self.clock()
        k = min(len(snap.idle), len(snap.pending)) if self.greedy else 0
        elapsed = self.clock() - t0
        self.stats.record(snap, k, float("nan"), elapsed)
        return Decision(k)

    def set_cost(self, cost: CostModel) -> None:
        """A rule does not predict: a refined cost model changes nothing."""


def auto_policy(mode: Mode) -> str:
    """What ``auto`` is in ``mode``: ``greedy`` with TCSS, else ``bts``."""
    return "greedy" if mode.tcss else "bts"


def resolved_policy(policy: str, plan: StepPlan) -> str:
    """``policy`` with ``auto`` resolved for ``plan``'s mode (``auto_policy``)."""
    return auto_policy(plan.mode) if policy == "auto" else policy


def make_tag_policy(plan: StepPlan, cost: CostModel, config: BTSConfig | None = None,
                    clock: Callable[[], float] = time.perf_counter) -> BTS | FixedRule:
    """The policy ``config.policy`` names, ``auto`` resolved by ``resolved_policy`` (default: ``BTSConfig()``)."""
    config = config or BTSConfig()
    policy = resolved_policy(config.policy, plan)
    if policy == "bts":
        return BTS(plan, cost, config, clock)
    return FixedRule(policy == "greedy", clock)
