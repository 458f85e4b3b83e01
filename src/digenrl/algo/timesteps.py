"""Which denoising steps of a trajectory are SDE steps and which are trained.

Strategies (``T`` sampling steps, indices 0..T-1, 0 = the noisiest):

* ``fraction``: every step is an SDE step; the first ``S = max(1, round(f * T))`` steps are trained
  (Flow-GRPO's ``timestep_fraction``: the high-noise steps carry the exploration).
* ``uniform``: every step is an SDE step; ``S`` evenly spaced steps are trained.
* ``window`` (Flow-GRPO-Fast): SDE only inside a window of ``window_size`` consecutive steps whose start is
  drawn from ``window_range`` for each step of training (seeded by (run seed, step)); ODE elsewhere; only the
  window steps are trained.

The final step of ``cps`` has zero std (sigma' = 0), so it is excluded from the trained set.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class TimestepPlan:
    sde_steps: tuple[int, ...]
    trained: tuple[int, ...]


def stable_seed(*parts: int | str) -> int:
    """A 63-bit seed derived only from ``parts`` (stable across processes and Python versions)."""
    h = hashlib.blake2b(repr(tuple(parts)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)


def select_timesteps(
    num_steps: int,
    *,
    strategy: str = "fraction",
    fraction: float = 1.0,
    window_size: int = 2,
    window_range: tuple[int, int] | None = None,
    seed: int = 0,
    step: int = 0,
    sde_kind: str = "flow_grpo",
) -> TimestepPlan:
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    last_ok = num_steps - 1 if sde_kind == "cps" else num_steps
    if strategy in ("fraction", "uniform"):
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"timestep fraction must be in (0, 1], got {fraction}")
        n = min(max(1, round(fraction * num_steps)), last_ok)
        if strategy == "fraction":
            trained = tuple(range(n))
        else:
            trained = tuple(sorted({round(i * (last_ok - 1) / max(n - 1, 1)) for i in range(n)}))
        return TimestepPlan(sde_steps=tuple(range(num_steps)), trained=trained)
    if strategy == "window":
        lo, hi = window_range if window_range is not None else (0, last_ok - window_size)
        if window_size < 1 or lo < 0 or hi < lo or hi + window_size > last_ok:
            raise ValueError(
                f"sde window size {window_size} with range {(lo, hi)} does not fit {num_steps} steps"
            )
        import random

        start = random.Random(stable_seed(seed, step, "window")).randint(lo, hi)
        steps = tuple(range(start, start + window_size))
        return TimestepPlan(sde_steps=steps, trained=steps)
    raise ValueError(f"unknown timestep strategy {strategy!r}; expected fraction, uniform or window")
