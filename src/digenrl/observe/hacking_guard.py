"""Reward-hacking guard (``eval.guard``; what it logs and what each ``eval.guard_action`` does: docs/rewards.md,
"Reward-hacking guard"): scores of the held-out eval samples that the run does not optimise, tracked per eval,
and what to do when one falls while the trained eval reward rises.

``eval.guard`` is a table like ``reward``: each name is a registered reward (``rewards.registry``) or ``drift``
(``rewards.drift``; options ``bins`` 16, ``patch`` 8, ``flat_std`` 0.02). An entry may set ``tolerance`` (default
``eval.guard_tolerance``); ``weight`` is refused.

**When a guard trips.** At an eval at step k > 0 with eval reward ``e_k > e_0``, guard ``g`` with first value
``g_0`` (the eval before training) trips when it fell by more than its tolerance ``tol``:

    (g_0 - g_k) / |g_0| > tol          (relative; where |g_0| < 1e-6: g_0 - g_k > tol, absolute)

For ``drift`` ``g_0 = 1`` exactly, so it trips when ``D > tol``. ``warn`` prints one line per guard each time it
starts to be tripped; ``checkpoint`` writes the (EMA) eval weights to ``PRE_DIVERGENCE`` at every eval until the
first trip; ``stop`` ends the run after that step (exit ``EXIT_GUARD`` = 3), but at the final eval only warns.
The controller scores each eval at its step boundary (``runtime.between_steps``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from digenrl.safe_files import atomic_write_bytes

from .progress import line

EXIT_GUARD = 3  # digenrl train: a run ended by eval.guard_action=stop
DRIFT = "drift"
PRE_DIVERGENCE = "guard_pre_divergence.safetensors"
ZERO = 1e-6  # |first value| below this: the fall is measured absolutely


class DriftOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    bins: int = Field(16, ge=2, le=256)
    patch: int = Field(8, ge=2)
    flat_std: float = Field(0.02, gt=0.0)


@dataclass(frozen=True)
class GuardSpec:
    """The validated ``eval.guard`` table: reward entries (registry specs), drift options, tolerances."""

    rewards: list  # rewards.registry.RewardSpec
    drift: DriftOptions | None
    tolerance: dict[str, float]

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.rewards] + ([DRIFT] if self.drift is not None else [])


def _renamed(msg: str) -> str:
    return re.sub(r"\breward\.", "eval.guard.", msg)


def parse_guard(table: dict[str, Any], default_tolerance: float) -> GuardSpec:
    """Validate ``eval.guard`` (names, options, tolerances) without building anything; ``ValueError`` (or
    ``FileNotFoundError`` for a reward's missing weights) naming ``eval.guard.<name>[.<option>]``."""
    from digenrl.rewards.registry import RewardConfigError, parse_reward_spec

    rewards, drift, tol = {}, None, {}
    for name, opts in table.items():
        opts = dict(opts or {})
        if "weight" in opts:
            raise ValueError(f"eval.guard.{name}.weight: a guard is scored, not optimised; it has no weight")
        t = opts.pop("tolerance", default_tolerance)
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise ValueError(f"eval.guard.{name}.tolerance: expected a finite number > 0, got {t!r}")
        tol[str(name)] = float(t)
        if name == DRIFT:
            try:
                drift = DriftOptions.model_validate(opts)
            except ValidationError as e:
                err = e.errors()[0]
                key = ".".join(str(p) for p in err["loc"])
                what = "unknown option (options: bins, patch, flat_std, tolerance)" if err["type"] == "extra_forbidden" \
                    else f"{err['msg']} (got {err.get('input')!r})"
                raise ValueError(f"eval.guard.drift.{key}: {what}") from None
        else:
            rewards[str(name)] = opts
    specs = []
    if rewards:
        try:
            specs = parse_reward_spec(rewards)
        except RewardConfigError as e:
            raise ValueError(_renamed(str(e))) from None
        except FileNotFoundError as e:
            raise FileNotFoundError(_renamed(str(e))) from None
    return GuardSpec(specs, drift, tol)


def falls(first: float, value: float, tol: float) -> bool:
    """Whether ``value`` fell by more than ``tol`` from ``first`` (relative; absolute where ``|first| < 1e-6``)."""
    if abs(first) < ZERO:
        return first - value > tol
    return (first - value) / abs(first) > tol


def tripped(first: dict[str, float], values: dict[str, float], eval0: float, eval_reward: float,
            tolerance: dict[str, float]) -> list[str]:
    """The guards that fell by more than their tolerance while the eval reward rose (``eval_reward > eval0``)."""
    if not (math.isfinite(eval0) and eval_reward > eval0):
        return []
    return [n for n, v in values.items() if n in first and falls(first[n], v, tolerance[n])]


class GuardMonitor:
    """Scores the guards on each eval's samples (``measure``) and acts on a trip (``check``)."""

    def __init__(self, cfg, run_dir: Path, *, spec: GuardSpec | None = None, rewards=None):
        """``rewards``: the built guard rewards (a ``WeightedSum`` or anything with ``score``; default built from
        the spec)."""
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.action = cfg.eval.guard_action
        self.spec = spec or parse_guard(cfg.eval.guard, cfg.eval.guard_tolerance)
        if rewards is None and self.spec.rewards:
            from digenrl.rewards.base import WeightedSum

            rewards = WeightedSum({r.name: (1.0, r.factory(**r.options)) for r in self.spec.rewards})
        self.rewards = rewards
        self.base = None  # rewards.drift.ImageStats of the base model's eval samples
        self.first: dict[str, float] = {}
        self.history: dict[str, list[tuple[int, float]]] = {n: [] for n in self.spec.names}
        self.active: set[str] = set()  # guards tripped at the last eval
        self.trips: list[dict] = []
        self.tripped_at: int | None = None  # the step of the run's first trip
        self.stop: dict | None = None
        self.last: dict[str, float] = {}

    # ---- measuring ---------------------------------------------------------------------------------------
    def measure(self, step: int, batch) -> dict[str, float]:
        """``guard/<name>`` (and ``guard/drift/<part>``) of an eval's samples; the eval at step 0 sets the base."""
        from digenrl.rewards.drift import drift, image_stats

        values: dict[str, float] = {}
        if self.rewards is not None:
            _, parts = self.rewards.score(batch.images, batch.prompts)
            for r in self.spec.rewards:
                values[r.name] = float(parts[r.name].mean())
        row: dict[str, float] = {}
        if self.spec.drift is not None:
            o = self.spec.drift
            stats = image_stats(batch.images, bins=o.bins, patch=o.patch, flat_std=o.flat_std)
            if self.base is None:
                self.base = stats
            d = drift(self.base, stats)
            values[DRIFT] = d["drift"]
            row.update({f"guard/{DRIFT}/{k}": v for k, v in d.items() if k != "drift"})
        for n, v in values.items():
            self.first.setdefault(n, v)
            self.history[n].append((step, v))
        self.last = {**{f"guard/{n}": v for n, v in values.items()}, **row}
        return dict(self.last)

    # ---- acting ------------------------------------------------------------------------------------------
    def check(self, step: int, eval0: float, eval_reward: float, *, final: bool = False,
              weights: Callable[[], bytes] | None = None) -> list[str]:
        """Act on the guards of the eval at ``step`` (after ``measure``); returns the tripped guards."""
        values = {k[len("guard/"):]: v for k, v in self.last.items() if k.count("/") == 1}
        hit = tripped(self.first, values, eval0, eval_reward, self.spec.tolerance) if step > 0 else []
        new = [n for n in hit if n not in self.active]
        self.active = set(hit)
        trips = [{"guard": n, "step": step, "first": self.first[n], "value": values[n],
                  "eval_reward_initial": eval0, "eval_reward": eval_reward} for n in hit]
        self.trips += trips
        if self.action != "none":
            for n in new:
                self._warn(n, step, values[n], eval0, eval_reward)
        if hit and self.tripped_at is None:
            self.tripped_at = step
        if self.action == "checkpoint" and self.tripped_at is None and weights is not None:
            atomic_write_bytes(self.run_dir / PRE_DIVERGENCE, weights())
        if self.action == "stop" and hit and not final and self.stop is None:
            self.stop = {"guard": hit[0], "guards": hit, **trips[0]}  # (the trip's keys after "guards")
        return hit

    def _warn(self, name: str, step: int, value: float, eval0: float, eval_reward: float) -> None:
        first = self.first[name]
        fall = f"{100 * (first - value) / abs(first):.0f}%" if abs(first) >= ZERO else f"{first - value:.3g}"
        then = {"stop": "; eval.guard_action=stop: the run ends after this step",
                "checkpoint": f"; the weights before it are in {self.run_dir / PRE_DIVERGENCE}"}.get(self.action, "")
        line(f"digenrl: warning: eval.guard: guard/{name} fell {fall} ({first:.4g} -> {value:.4g}, tolerance "
             f"{self.spec.tolerance[name]:g}) at step {step} while the eval reward rose ({eval0:.4g} -> "
             f"{eval_reward:.4g}): the trained reward may be hacked (see the samples and reward_curve.png){then}")

    # ---- resume / summary --------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """JSON-able state for a checkpoint's counters (a resumed run keeps the base samples' statistics)."""
        return {"base": self.base.as_dict() if self.base is not None else None, "first": self.first,
                "history": {n: [list(p) for p in h] for n, h in self.history.items()}, "active": sorted(self.active),
                "trips": self.trips, "tripped_at": self.tripped_at}

    def restore(self, state: dict[str, Any] | None) -> None:
        from digenrl.rewards.drift import ImageStats

        if not state:
            return
        self.base = ImageStats.from_dict(state["base"]) if state.get("base") else None
        self.first = {k: float(v) for k, v in state.get("first", {}).items()}
        for n, h in state.get("history", {}).items():
            if n in self.history:
                self.history[n] = [(int(s), float(v)) for s, v in h]
        self.active = set(state.get("active", ()))
        self.trips = list(state.get("trips", ()))
        self.tripped_at = state.get("tripped_at")

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"guard": {n: {"initial": h[0][1], "final": h[-1][1], "min": min(v for _, v in h)}
                                         for n, h in self.history.items() if h},
                               "guard_tripped": self.trips}
        if self.stop is not None:
            out["guard_stop"] = self.stop
        return out
