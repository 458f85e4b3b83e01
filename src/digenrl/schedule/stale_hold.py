"""When a TCSS generator should wait instead of starting a next-step fragment (``full`` with a joined publish).

With ``plan.publish_joins`` (a broadcast the generators take part in) the step's publish starts only once every
generator is free, so a stale fragment still running at the commit holds up every trainer rank and every other
generator until it ends. A generator free at ``t`` with a stale fragment of ``d`` seconds next, and the step's
commit predicted to end at ``C`` (``StepModel.predict_commit`` with no further TAG, or the in-flight commit's
launch + its duration)::

    overrun = t + d - C
    hold  iff  overrun > 0  and  overrun * h > C - t          (h = plan.stale_hold, tuning.stale_hold)

Starting the fragment makes every trainer rank and every other generator wait out ``overrun`` in the
publish; holding costs this generator the ``C - t`` seconds until the commit, and the next step's rollout the
work it would have done. Which weighs more depends on how much slack the generator pool has, so ``h`` is a
plan knob the planner searches (``sim.run_pick.STALE_HOLDS``) and 0 turns the rule off. The fragment stays
pending and is generated after the publish with the new version (on-policy), so holding changes when work
runs, never what is computed. Not applied with several minibatch rounds per step (the prediction is of
round 0's commit) nor outside TCSS with a joined publish.
"""

from __future__ import annotations

from .bts_model import Snapshot, StepModel
from .plan import StepPlan


def applies(plan: StepPlan) -> bool:
    """The rule is used at all: h > 0, TCSS, a joined publish, one commit per step."""
    return plan.stale_hold > 0 and plan.mode.tcss and plan.publish_joins and plan.rounds == 1


def hold(plan: StepPlan, model: StepModel, t: float, size: int, commit_end: float | None,
         snapshot: Snapshot | None) -> bool:
    """True: the free generator waits rather than start a stale fragment of ``size`` generations at ``t``.
    ``commit_end``: the end of the commit in flight (None: predicted from ``snapshot``)."""
    if commit_end is None:
        if snapshot is None:
            return False
        commit_end = model.predict_commit(snapshot, 0)
    over = t + model.dur.generate(size, False, False) - commit_end
    return over > 0 and over * plan.stale_hold > commit_end - t
