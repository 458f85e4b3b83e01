"""The execution sections (``runtime.*``, its ``bts`` and ``calibration`` options) and the generator pool's
inference copy (``generator.*``)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from digenrl.schedule.plan import Mode

from .base import EXPERT, _Strict
from .model import SequenceParallelConfig


class BTSOptions(_Strict):
    """Options of the BTS search (``schedule.bts.BTSConfig``), used when ``runtime.tag_policy`` is ``bts``."""

    depth: int = Field(2, ge=0)  # recursion depth over future bubbles
    """Recursion depth over future bubbles (2: with exact costs depth 0 was slower where it decided otherwise,
    under CPU jitter slightly faster; depth 4 never differed; `benchmarks/bts_depth.py`, [simulation](simulation.md)
    "Where depth matters")."""
    budget_nodes: int = Field(2000, ge=1)  # search nodes per decision (deterministic; over it: shallower result)
    """Search nodes per decision (deterministic; over it: a shallower result)."""
    budget_s: float | None = Field(None, gt=0.0)  # optional wall-clock cap per decision (makes decisions load-dependent)
    """Optional wall-clock cap per decision (makes decisions load-dependent)."""
    max_branch: int = Field(4, ge=1)  # candidates k = 0..m when m <= max_branch, else {0, 1, 2, 4, ..., m}
    """Candidates k = 0..m when m <= max_branch, else {0, 1, 2, 4, ..., m}."""
    online: bool = True  # refine the profile from the run's own action times at every step (schedule.online_cost)
    """BTS's profile follows the run's own action times, one factor per action kind refined every step
    (`cost_scale/<kind>` in metrics.jsonl).
    """
    online_decay: float = Field(0.5, ge=0.0, lt=1.0)  # weight of a step's action times one step later
    """The weight of a step's action times one step later."""


class CalibrationOptions(_Strict):
    """When a run measures its cost profile on its own workers before the first step (``runtime.calibration``)."""

    when: Literal["auto", "always", "never"] = "auto"  # profile.json: for `digenrl simulate/plan --profile` too
    """When a run times its ops on its own workers before step 1: `auto` (TAG modes without `runtime.profile`),
    `always` or `never`; written to `run_dir/profile.json`.
    """
    repeats: int = Field(2, ge=1, json_schema_extra=EXPERT)  # timed repeats of every op (after one warm-up); their mean is the cost
    """Timed repeats of every op (after one warm-up); their mean is the cost."""


class RuntimeConfig(_Strict):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_enum_values=True,
                              use_attribute_docstrings=True)

    mode: Mode = Field(Mode.COLOCATED, validate_default=True)  # validated against the scheduler's modes; stored as its string value
    """`colocated`, `naive`, `gap`, `gap_tsp`, `gap_tsp_tag` or `full` (TCSS); anything but a single-worker `colocated`
    runs on Ray.
    """
    generators: int = Field(1, ge=1)
    """Generator pool size (colocated: unused, keep 1)."""
    trainers: int = Field(1, ge=1)
    """Trainer ranks (colocated: workers that both generate and train)."""
    fragment_size: int = Field(4, ge=1)  # generations per fragment (GAP)
    """GAP fragment: generations of one prompt group per generate action (clipped to G)."""
    max_stale_fraction: float = Field(0.25, ge=0.0, le=1.0)  # TCSS cap (0.5 made the demo end lower in 1 of 3 runs)
    """`full` (TCSS): at most this share of a step generated one version stale."""
    address: str | None = None  # join an existing Ray cluster; None starts a local one
    """Join this Ray cluster (`HEAD:6379` or `auto`); null: start a local Ray."""
    generator_resources: dict[str, float] = {}
    """Ray resources each generator asks for (custom labels place heterogeneous pools; `CPU` / `GPU` override the
    counts).
    """
    trainer_resources: dict[str, float] = {}
    """Ray resources each trainer rank asks for."""
    threads_per_worker: int = Field(1, ge=1, le=256)  # a local run: at most the machine's cores (validate.py)
    """Torch threads (and Ray CPUs) per worker; a local run: at most the machine's cores."""
    publish: Literal["object_store", "broadcast", "stream"] = "object_store"  # runtime/publish.py
    """Weight path trainers -> generators: `object_store` (rank 0's copy), `broadcast` (torch.distributed) or `stream`
    (every rank's shards, sent while the trainers go on).
    """
    stale_hold: float = Field(0.0, ge=0.0, allow_inf_nan=False, json_schema_extra=EXPERT)  # schedule.stale_hold
    """`full` with `broadcast` / `stream`: a free generator waits instead of starting a stale fragment that would end
    `overrun` s past the step's predicted commit when overrun x this > its wait; 0: never waits (the planner picks
    it).
    """
    gang_groups: bool = Field(True, json_schema_extra=EXPERT)
    """TAG on a sharded pool: a gang takes the next fragment per rank across prompt groups; false: only the head
    group's (a smaller gang that ends sooner; the planner picks it).
    """
    checkpoint_every: int = Field(20, ge=0)  # resumable checkpoint every N committed steps (0: only at the end / on a signal)
    """A resumable checkpoint every N committed steps in `run_dir/checkpoints/` (0: only at the end and on a signal)."""
    keep_checkpoints: int = Field(2, ge=1)
    """The newest K resumable checkpoints are kept."""
    max_restarts: int = Field(3, ge=0)  # Ray modes: worker failures recovered (restart + replay) before giving up
    """Ray modes: worker failures recovered (restart + replay) per run before the run stops."""
    watchdog_s: float | None = Field(None, gt=0.0)  # None: runtime.deadlines (cost model, else ObservedCosts)
    """Seconds before a silent worker call counts as stalled; null: derived (60 s + 20 x the action's modelled or
    observed time).
    """
    collective_timeout_s: float = Field(600.0, gt=0.0, allow_inf_nan=False)  # trainer pool, broadcast publish
    """Seconds a torch.distributed collective may wait for the other ranks; longer is an error naming the rank and its
    action.
    """
    profile: str | None = None  # cost profile JSON for BTS (TAG modes); None: measured on the workers at start
    """A cost profile JSON (`digenrl profile`, a run's `profile.json` / `profile_observed.json`) for BTS and the
    watchdog; null: measured on the workers at start where needed.
    """
    calibration: CalibrationOptions = CalibrationOptions()
    """When and how the run measures its own costs (`runtime.calibration.*`)."""
    tag_inference_copy: bool = Field(False, json_schema_extra=EXPERT)
    """TAG on a sharded pool: all-gather an unsharded copy of the weights once per version and generate from it without
    per-forward gathers.
    """
    tag_policy: Literal["bts", "greedy", "none"] = "bts"
    """TAG modes: who gives fragments to idle trainer ranks at a bubble: `bts` (the search), `greedy` (one fragment
    per idle trainer rank while fragments are pending) or `none` (k = 0)."""
    bts: BTSOptions = Field(BTSOptions(), json_schema_extra=EXPERT)
    """Options of the BTS search (`runtime.bts.*`)."""
    generator_sequence_parallel: SequenceParallelConfig = SequenceParallelConfig()
    """The same for generators: each generator is d Ray actors in one torch.distributed group that denoise each
    fragment together; disaggregated modes only ([sequence parallelism](sequence_parallel.md)).
    """

    def bts_config(self):
        """The scheduler's ``BTSConfig`` for ``tag_policy`` and ``bts`` (pass it as ``Scheduler(bts_config=...)``)."""
        from digenrl.schedule.bts import BTSConfig

        return BTSConfig(**self.bts.model_dump(), policy=self.tag_policy)  # BTSOptions: BTSConfig's field names


class GeneratorConfig(_Strict):
    """The generator pool's inference copy of the policy (``models.fast_generator``; docs/fast_generator.md). The
    trainers keep their own weights, and TAG fragments are generated with them."""

    merge_lora: bool = False
    """Merge the LoRA delta into the base weights once per published version, W = W0 + s B A (no adapter matmuls
    per forward); needs `model.lora.enabled` and a generator pool.
    """
    dtype: Literal["bfloat16", "float16", "float32"] | None = None
    """The copy's weight dtype (bf16 on GPU), independent of the trainers' masters; the SDE step and the recorded
    log-probs stay float32; null: `model.dtype`.
    """
    compile: Literal["none", "default", "reduce-overhead", "max-autotune"] = "none"
    """`torch.compile` of the transformer forward at the run's fixed shapes, compiled once and reused across versions
    (weights swapped in place); `reduce-overhead` adds CUDA graphs.
    """
