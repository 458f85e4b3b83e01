"""What the scheduler tracks about one step: its work until it is published (``StepWork``, and the step's starting
state) and its statistics (``StepStats``; times are the executor's event times)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .layout import Fragment, step_fragments
from .plan import StepPlan


@dataclass
class StepWork:
    """One step's work state in the scheduler."""

    pending: deque[Fragment]                 # fragments not dispatched yet, in dispatch order
    outstanding: dict[int, int]              # group -> generations not generated yet
    groups_left: int                         # groups whose rewards are not all in
    done: set[int] = field(default_factory=set)           # groups whose rewards are all in
    chunks_left: int = 0                     # chunks of the current training round not trained yet
    stale_generations: int = 0

    @classmethod
    def start(cls, plan: StepPlan, step: int) -> "StepWork":
        """Step ``step`` before any of its work: every fragment pending (an empty step past the last one)."""
        frags = step_fragments(plan, step) if 0 <= step < plan.steps else []
        outstanding: dict[int, int] = {}
        for fr in frags:
            outstanding[fr.group] = outstanding.get(fr.group, 0) + fr.size
        return cls(deque(frags), outstanding, plan.prompts)


@dataclass
class StepStats:
    step: int
    first_dispatch: float | None = None   # first Generate of the step
    committed: float | None = None        # Committed event of the step's last round
    commits: int = 0                      # optimizer steps taken (rounds committed)
    published: float | None = None        # Published event (version step + 1)
    fragments: int = 0
    tag_fragments: int = 0
    stale_generations: int = 0
    generations: int = 0                  # B
    cost_scales: dict[str, float] = field(default_factory=dict)  # online factors BTS used in the step (kind -> x)
