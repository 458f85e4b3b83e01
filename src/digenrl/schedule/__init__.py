"""The scheduler: a pure state machine from events to actions (no torch, no ray, no clock).

Both executors drive exactly this API: ``digenrl.sim`` in virtual time, ``digenrl.runtime`` with Ray actors
and wall-clock time. Terms as in docs/architecture.md.

Usage::

    plan = StepPlan(prompts=P, generations=G, fragment_size=f, trained_timesteps=S, sampling_steps=T,
                    chunk_generations=cg, chunk_timesteps=cs, generators=("g0", "g1"),
                    trainers=("t0", "t1"), mode="gap_tsp_tag", steps=K, max_stale_fraction=0.25)
    sched = Scheduler(plan, cost=my_cost_model)      # cost: any CostModel; required for TAG modes
    actions = sched.start(t0)                        # list[Action], all start at t0
    while not sched.done:
        event = wait_for_next_completion()           # one of the four events, with its end time
        actions += sched.on_event(event)             # each new action starts at event.time

Actions (``Generate``, ``Train``, ``Commit``, ``Publish``; each reported by its event, ``action.event(t)``): a
worker runs one action at a time and the scheduler only hands work to idle workers; ``actions.py`` says what
each one asks of the executor.

State and results: ``sched.done`` (every step committed and published), ``sched.stats`` (``StepStats`` per
step: dispatch / commit / publish times, TAG and stale counts, online cost factors),
``sched.bts_stats`` (decisions, memo hit rate, search times, predicted vs realized commit times),
``sched.train_step``, ``sched.published``, ``sched.cost_scales`` (the online
factors of ``BTSConfig.online``: see ``online_cost``).

Modes (``Mode``): ``colocated`` (trainer ranks generate the whole step, then train the classic layout, then
commit + publish), ``naive`` (disaggregated, full-batch barrier), ``gap`` (groups trained as their rewards
come in), ``gap_tsp`` (TSP chunks on any rank), ``gap_tsp_tag`` (+ TAG decided by BTS, or by the policy ``BTSConfig.policy`` names: see ``tag_policy``), ``full`` (+ TCSS:
after every fragment of step k is dispatched, generators produce up to ``floor(max_stale_fraction * B)``
trajectories of step k + 1 with version k; their chunks are trained after commit k).

Cost models (``CostModel`` protocol: ``time(op, batch, pool) -> seconds``) price actions through
``Durations``; see ``cost.py`` for the operations and formulas.
"""

from .actions import (Action, ChunkTrained, Commit, Committed, Event, FragmentGenerated, Generate, Publish,
                      Published, Train, step_number)
from .bts import BTS, TAG_POLICIES, BTSConfig, BTSStats, Decision
from .bts_model import Snapshot
from .cost import GENERATOR, OPS, TRAINER, CostModel, Durations, Op
from .layout import Chunk, Fragment, classic_chunks, group_fragments, step_fragments, tsp_chunks
from .online_cost import OnlineCosts, ScaledCost
from .plan import MODES, Mode, PlanError, StepPlan
from .scheduler import Scheduler, SchedulerError
from .step_work import StepStats
from .tag_policy import FixedRule, make_tag_policy

__all__ = [
    "Action", "BTS", "BTSConfig", "BTSStats", "Chunk", "ChunkTrained", "Commit", "Committed", "CostModel",
    "Decision", "Durations", "Event", "FixedRule", "Fragment", "FragmentGenerated", "GENERATOR", "Generate", "MODES", "Mode",
    "OPS", "OnlineCosts", "Op", "PlanError", "Publish", "Published", "ScaledCost", "Scheduler", "SchedulerError", "Snapshot", "StepPlan",
    "StepStats", "TAG_POLICIES", "TRAINER", "Train", "classic_chunks", "group_fragments", "step_fragments", "tsp_chunks", "make_tag_policy",
    "step_number",
]
