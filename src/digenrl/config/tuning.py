"""The ``tuning`` section: the planner's outputs and the knobs a user rarely sets, apart from the keys a user sets.

Old configs that set these keys under their former homes (``runtime.stale_hold``, ``runtime.bts.*``,
``train.loss_scale_init`` ...) are read into this section with a notice (``load.MOVED``)."""

from __future__ import annotations

from pydantic import Field

from digenrl.schedule.bts import BTSConfig

from .base import _Strict


class BTSOptions(_Strict):
    """Options of the BTS search (``schedule.bts.BTSConfig``), used where BTS decides (``runtime.tag_policy``:
    ``bts``, or ``auto`` outside ``full``)."""
    # the defaults are BTSConfig's, written there once; Config.bts_config passes these fields to it by name

    depth: int = Field(BTSConfig.depth, ge=0)  # recursion depth over future bubbles
    """Recursion depth over future bubbles (2: with exact costs depth 0 was slower where it decided otherwise,
    under CPU jitter slightly faster; depth 4 never differed; `benchmarks/bts_depth.py`, [simulation](simulation.md)
    "Where depth matters")."""
    budget_nodes: int = Field(BTSConfig.budget_nodes, ge=1)  # search nodes per decision (deterministic; over it: shallower result)
    """Search nodes per decision (deterministic; over it: a shallower result)."""
    budget_s: float | None = Field(BTSConfig.budget_s, gt=0.0)  # optional wall-clock cap per decision (makes decisions load-dependent)
    """Optional wall-clock cap per decision (makes decisions load-dependent)."""
    max_branch: int = Field(BTSConfig.max_branch, ge=1)  # candidates k = 0..m when m <= max_branch, else {0, 1, 2, 4, ..., m}
    """Candidates k = 0..m when m <= max_branch, else {0, 1, 2, 4, ..., m}."""
    online: bool = BTSConfig.online  # refine the profile from the run's own action times at every step (schedule.online_cost)
    """BTS's profile follows the run's own action times, one factor per action kind refined every step
    (`cost_scale/<kind>` in metrics.jsonl).
    """
    online_decay: float = Field(BTSConfig.online_decay, ge=0.0, lt=1.0)  # weight of a step's action times one step later
    """The weight of a step's action times one step later."""


class TuningConfig(_Strict):
    """The planner's outputs and tuning knobs a user rarely sets: `digenrl plan` writes `stale_hold`, `gang_groups`
    and `tag_inference_copy` into the config it writes ([planning](planning.md)); the rest tune the BTS search, the
    calibration and fp16's loss scale. They are set like any key (`tuning.stale_hold=0.5`). An older config's
    `runtime.stale_hold`, `runtime.gang_groups`, `runtime.tag_inference_copy`, `runtime.calibration.repeats`,
    `train.loss_scale_init` and `runtime.bts.*` are read as these keys, with one notice on stderr per moved key; a
    config that sets both a key's old and new name is refused. Test hooks are not config keys (`DIGENRL_TEST_HOOKS`,
    [development](development.md))."""

    stale_hold: float = Field(0.0, ge=0.0, allow_inf_nan=False)  # schedule.stale_hold
    """`full` with `broadcast` / `stream`: a free generator waits instead of starting a stale fragment that would end
    `overrun` s past the step's predicted commit when overrun x this > its wait; 0: never waits (the planner picks
    it).
    """
    gang_groups: bool = True
    """TAG on a sharded pool: a gang takes the next fragment per rank across prompt groups; false: only the head
    group's (a smaller gang that ends sooner; the planner picks it).
    """
    tag_inference_copy: bool = False
    """TAG on a sharded pool: all-gather an unsharded copy of the weights once per version and generate from it without
    per-forward gathers.
    """
    calibration_repeats: int = Field(2, ge=1)  # timed repeats of every op (after one warm-up); their mean is the cost
    """Timed repeats of every op (after one warm-up); their mean is the cost."""
    loss_scale_init: float = Field(65536.0, gt=0.0)  # fp16: initial dynamic loss scale
    """fp16: the initial dynamic loss scale."""
    bts: BTSOptions = BTSOptions()
    """Options of the BTS search (`tuning.bts.*`)."""
