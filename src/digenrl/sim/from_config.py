"""Simulating a DigenRL run's own plan: ``digenrl simulate --config FILE [--set key=value ...] --profile P``.

The roofline path of ``digenrl simulate`` plans a model preset on a GPU testbed. This path instead takes the
run configuration a user trains with, builds exactly the ``StepPlan`` the Ray runtime would execute for each
mode (``digenrl.control.run_plan.plan_run``: pools, P x G, fragment size, trained timesteps, chunk shape, stale
cap) and prices it with a measured profile (``digenrl profile``). ``colocated`` runs on all
``runtime.generators + runtime.trainers`` workers. The step time is makespan / steps, as in the roofline path.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..control.profile import ProfileCost
from ..control.timeline import RunResult
from .executor import simulate


@dataclass
class ConfigRun:
    """One simulated mode of a config; the fields ``sim.cli.rows_of`` reads, like ``planner.ModeRun``."""

    mode: str
    plan: object
    result: RunResult
    note: str = ""

    @property
    def n_gen(self) -> int:
        return len(self.plan.generators)

    @property
    def n_train(self) -> int:
        return len(self.plan.trainers)


def _mode_overrides(cfg, mode: str) -> list[str]:
    if mode == "colocated":
        workers = cfg.runtime.generators + cfg.runtime.trainers
        return ["runtime.mode=colocated", f"runtime.trainers={workers}", "runtime.generators=1"]
    return [f"runtime.mode={mode}"]


def run_config_modes(config: str | None, sets: list[str], cost: ProfileCost, modes: list[str], *,
                     jitter: float = 0.0, seed: int = 0, record_mode: str | None = None) -> dict[str, ConfigRun]:
    """Every requested mode plus ``naive`` and ``colocated`` (the speedup baselines). Raises ConfigError."""
    from ..config import load_config
    from ..control.run_plan import plan_run

    base = load_config(config, sets)
    runs = {}
    for m in dict.fromkeys(list(modes) + ["naive", "colocated"]):
        plan = plan_run(load_config(config, sets + _mode_overrides(base, m))).plan
        runs[m] = ConfigRun(m, plan, simulate(plan, cost, jitter=jitter, seed=seed, record=(m == record_mode)))
    return runs
