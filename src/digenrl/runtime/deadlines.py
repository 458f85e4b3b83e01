"""Deadlines of the controller's waits (issue 22: no wait without a deadline), so that a stalled worker becomes a
``WorkerFailure`` naming it (a recovery, or a clear error with exit 1) instead of a hang. With
``runtime.watchdog_s`` = w:

* an action of the schedule (``watchdog``): w; else 60 s + 20 x its modelled time where the run has a cost
  model; else from the run's own observed costs (``ObservedCosts``): ``OBSERVED_FLOOR_S`` + ``OBSERVED_FACTOR`` x
  the slowest per-unit time of its kind seen so far x its units, ``DEFAULT_OP_S`` before one of its kind completed;
* a start-up wait (building the actors and their models, forming the groups, restoring, the first publish):
  ``STARTUP_FACTOR`` x w = 30 w, else ``DEFAULT_STARTUP_S`` (a run that sets w sets it above a thirtieth of its
  model's load time);
* a calibration call (one timed execution of one op, ``timing.Calibration``): ``CALIBRATION_FACTOR`` x w = 2 w,
  else ``DEFAULT_OP_S``, whatever the number of sizes and repeats;
* an eval (before, between steps, after), a checkpoint's state, any other single call: ``CALL_FACTOR`` x w =
  10 w, else ``DEFAULT_CALL_S`` (an eval generates ``eval.num_prompts`` samples: many actions' worth).

A remote reward (``reward.remote``) is waited for by its own client for up to ``retry_window`` seconds (plus one
request's ``timeout``); ``remote_reward_wait`` is that bound, added to every wait that scores (a generation, an
eval, a calibration call), so a reward-service outage inside the client's window pauses the run instead of
restarting the generator."""

from __future__ import annotations

import inspect

from digenrl.config import Config
from digenrl.control.run_plan import RunPlan
from digenrl.schedule import Durations

DEFAULT_STARTUP_S = 1800.0
DEFAULT_OP_S = 600.0
DEFAULT_CALL_S = 1800.0
CALL_FACTOR = 10.0  # a call outside the schedule (eval, checkpoint) may take this many watchdogs
STARTUP_FACTOR = 30.0  # a start-up wait (the actors build their models) may take this many
CALIBRATION_FACTOR = 2.0  # a calibration call (one execution of one op, its first with its preparation)
OBSERVED_FLOOR_S = 60.0  # watchdog from observed costs: floor + factor x observed (the cost model's 60 s + 20 x)
OBSERVED_FACTOR = 20.0


def _bound(cfg: Config, factor: float, default: float) -> float:
    w = cfg.runtime.watchdog_s
    return default if w is None else factor * w


def calibration_deadline(cfg: Config) -> float:
    """Seconds one calibration call (``timing.Calibration.run``) may take, the remote reward's window excluded."""
    return _bound(cfg, CALIBRATION_FACTOR, DEFAULT_OP_S)


def call_deadline(cfg: Config) -> float:
    return _bound(cfg, CALL_FACTOR, DEFAULT_CALL_S)


def startup_deadline(cfg: Config) -> float:
    return _bound(cfg, STARTUP_FACTOR, DEFAULT_STARTUP_S)


def remote_reward_wait(cfg: Config) -> float:
    """The longest a scoring call may wait on the remote rewards of ``cfg.reward``: per remote part, its
    client's ``retry_window`` + one request's ``timeout`` (0 without a remote reward)."""
    from digenrl.rewards.client import build_remote_reward
    from digenrl.rewards.registry import parse_reward_spec

    try:
        specs = parse_reward_spec(cfg.reward)
    except ValueError:
        return 0.0
    defaults = {k: p.default for k, p in inspect.signature(build_remote_reward).parameters.items()}
    total = 0.0
    for rs in specs:
        if rs.factory is build_remote_reward:
            opts = {**defaults, **rs.options}
            total += float(opts["retry_window"]) + float(opts["timeout"])
    return total


class ObservedCosts:
    """The run's own action times, for the watchdog of a run without a cost model or ``runtime.watchdog_s``:
    the slowest seconds per unit seen so far for each kind of action (a fragment's generation on a generator or
    a trainer rank, a chunk's cell, a commit, a publish), measured by the driver from launch to completion (so
    including a weight transfer or a queue wait) and kept over the run's attempts."""

    def __init__(self) -> None:
        self.rate: dict[str, float] = {}

    def observe(self, action, seconds: float) -> None:
        """Per ``action.span_kind`` (a TAG generation apart) and unit of its ``size()``."""
        key = action.span_kind
        self.rate[key] = max(self.rate.get(key, 0.0), seconds / action.size().units)

    def deadline(self, action) -> float:
        """Seconds ``action`` may take: ``OBSERVED_FLOOR_S`` + ``OBSERVED_FACTOR`` x the slowest observed time
        per unit of its kind x its units; ``DEFAULT_OP_S`` while none of its kind has completed."""
        r = self.rate.get(action.span_kind)
        return DEFAULT_OP_S if r is None else OBSERVED_FLOOR_S + OBSERVED_FACTOR * r * action.size().units


def watchdog(run: RunPlan, cost, observed: ObservedCosts | None = None):
    """Seconds a call may take before its worker counts as stalled: ``runtime.watchdog_s``; else, with a cost
    model, 60 s + 20 x the action's modelled duration; else the bound from the run's observed action times
    (``ObservedCosts.deadline``: ``DEFAULT_OP_S`` until one of its kind completed). A side call (``action`` None:
    an eval or a checkpoint between steps) gets ``call_deadline`` in every case. A generation (it scores its
    samples) with a remote reward gets the reward client's own retry window on top (``remote_reward_wait``): the
    client waits out a service outage that long, and only past it is the worker at fault."""
    fixed, wait = run.cfg.runtime.watchdog_s, remote_reward_wait(run.cfg)
    side = call_deadline(run.cfg) + wait  # a side call (an eval between steps scores; a checkpoint)
    dur = Durations(run.plan, cost) if cost is not None else None
    observed = ObservedCosts() if observed is None else observed

    def budget(action) -> float | None:
        if action is None:
            return side
        scoring = wait if action.kind == "generate" else 0.0
        if fixed is not None:
            return fixed + scoring
        return (observed.deadline(action) if dur is None else 60.0 + 20.0 * dur.of(action)) + scoring

    return budget
