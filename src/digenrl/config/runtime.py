"""The execution sections (``runtime.*`` and its ``calibration`` options) and the generator pool's
inference copy (``generator.*``)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from digenrl.schedule.plan import Mode

from .base import _Strict
from .model import SequenceParallelConfig


class CalibrationOptions(_Strict):
    """When a run measures its cost profile on its own workers before the first step (``runtime.calibration``)."""

    when: Literal["auto", "always", "never"] = "auto"  # profile.json: for `digenrl simulate/plan --profile` too
    """When a run times its ops on its own workers before step 1: `auto` (TAG modes without `runtime.profile`),
    `always` or `never`; written to `run_dir/profile.json`.
    """


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
    """When the run measures its own costs (`runtime.calibration.*`; each op timed `tuning.calibration_repeats` times)."""
    tag_policy: Literal["auto", "bts", "greedy", "none"] = "auto"
    """TAG modes: who gives fragments to idle trainer ranks at a bubble: `bts` (the search, `tuning.bts.*`), `greedy` (one fragment
    per idle trainer rank while fragments are pending), `none` (k = 0), or `auto`: `greedy` in `full` (TCSS), `bts`
    otherwise, the policy that was faster on average in each mode ([simulation](simulation.md), "BTS decision
    quality")."""
    generator_sequence_parallel: SequenceParallelConfig = SequenceParallelConfig()
    """The same for generators: each generator is d Ray actors in one torch.distributed group that denoise each
    fragment together; disaggregated modes only ([sequence parallelism](sequence_parallel.md)).
    """


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
