"""Per-step statistics the scheduler keeps (times are the executor's event times)."""

from __future__ import annotations

from dataclasses import dataclass, field


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
