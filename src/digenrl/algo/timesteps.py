"""Which denoising steps of a trajectory are SDE steps and which are trained.

Strategies (``T`` sampling steps, indices 0..T-1, 0 = the noisiest):

* ``fraction``: every step is an SDE step; the first ``S = int(T * f)`` steps are trained (Flow-GRPO's
  ``num_train_timesteps = int(num_steps * timestep_fraction)``: Python's ``int``, so 0.99 of 10 is 9 and the last
  step, sigma' = 0, is left out as in every Flow-GRPO / DanceGRPO recipe).
* ``uniform``: every step is an SDE step; ``S = int(T * f)`` evenly spaced steps are trained.
* ``window`` (Flow-GRPO-Fast): SDE only inside a window of ``window_size`` consecutive steps, ODE elsewhere;
  only the window steps are trained. ``window_range = (lo, hi)`` is Flow-GRPO's ``sde_window_range``: the range
  the whole window lies in, ``start = randint(lo, hi - window_size)`` (both ends inclusive) and the window is
  ``start .. start + window_size - 1``. The start is drawn for each step of training, seeded by (run seed, step).
  Default range: ``(0, T - 1)`` (every step but the last, Flow-GRPO's no-window branch ``(0, len - 1)``).

* ``mixgrpo`` (MixGRPO, Li et al. 2025, arXiv 2507.21802): SDE only inside a window of ``window_size``
  consecutive steps, ODE elsewhere, only the window trained, like ``window``; but the window *moves with the
  training step* on MixGRPO's progressive schedule instead of being drawn. With ``w = window_size``,
  ``tau = shift_interval`` (MixGRPO's ``iters_per_group``), ``s = stride`` (its ``prog_overlap_step``) and
  ``M = T - 2`` (its ``max_timesteps = sampling_steps - 2``), the reference start after k steps is::

      P       = floor(M / s) + 1                      (positions 0, s, 2s, ... <= M, then roll back to 0)
      start_k = ((k // tau) mod P) * s

  and the reference window is ``range(start_k, min(start_k + w, M))``. Here the start is clamped to
  ``M - w`` so that the window always holds ``w`` steps (S stays fixed for the scheduler and the cost model):
  ``start = min(start_k, M - w)``, window ``start .. start + w - 1``. This equals the reference at every step
  where its window is whole (``start_k <= M - w``: the first ``(M - w + 1) * tau`` steps of every cycle, i.e.
  all 300 steps of MixGRPO's FLUX recipe: T = 25, w = 4, tau = 25, s = 1) and differs only where the reference
  shrinks the window at the end of a cycle (down to an empty window at ``start_k = M``).
  Source: Tencent-Hunyuan/MixGRPO, ``fastvideo/utils/grpo_states.py`` (``GRPOTrainingStates``, progressive
  strategy with ``prog_overlap`` and ``roll_back``) as ``fastvideo/train_grpo_flux.py`` drives it (one
  ``update_iteration`` per training step, after ``get_current_timesteps``) and
  ``scripts/finetune/finetune_flux_grpo_MixGRPO.sh`` sets it.

The final step of ``cps`` has zero std (sigma' = 0), so it is never trained.
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


def trained_count(num_steps: int, fraction: float) -> int:
    """Flow-GRPO's ``int(num_steps * timestep_fraction)`` (truncation, not rounding)."""
    n = int(num_steps * fraction)
    if n < 1:
        raise ValueError(f"train.timestep_fraction {fraction} of {num_steps} steps trains no step "
                         f"(int({num_steps} * {fraction}) = 0)")
    return n


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
    shift_interval: int = 25,
    stride: int = 1,
) -> TimestepPlan:
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    last_ok = num_steps - 1 if sde_kind == "cps" else num_steps
    if strategy in ("fraction", "uniform"):
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"timestep fraction must be in (0, 1], got {fraction}")
        n = min(trained_count(num_steps, fraction), last_ok)
        if strategy == "fraction":
            trained = tuple(range(n))
        else:
            trained = tuple(sorted({round(i * (last_ok - 1) / max(n - 1, 1)) for i in range(n)}))
        return TimestepPlan(sde_steps=tuple(range(num_steps)), trained=trained)
    if strategy == "window":
        lo, hi = window_range if window_range is not None else (0, num_steps - 1)
        if window_size < 1 or lo < 0 or hi - window_size < lo or hi > last_ok:
            raise ValueError(
                f"train.window_size {window_size} does not fit train.window_range {(lo, hi)} of {num_steps} steps "
                f"(need 0 <= lo <= hi - window_size and hi <= {last_ok})"
            )
        import random

        start = random.Random(stable_seed(seed, step, "window")).randint(lo, hi - window_size)
        steps = tuple(range(start, start + window_size))
        return TimestepPlan(sde_steps=steps, trained=steps)
    if strategy == "mixgrpo":
        start = mixgrpo_window_start(step, num_steps, window_size, shift_interval, stride)
        steps = tuple(range(start, start + window_size))
        return TimestepPlan(sde_steps=steps, trained=steps)
    raise ValueError(f"unknown timestep strategy {strategy!r}; expected fraction, uniform, window or mixgrpo")


def mixgrpo_window_start(step: int, num_steps: int, window_size: int, shift_interval: int, stride: int) -> int:
    """The first step of MixGRPO's window at training step ``step`` (0-based; module docstring)."""
    M = num_steps - 2
    if window_size < 1 or window_size > M:
        raise ValueError(f"train.window_size {window_size} does not fit MixGRPO's window range [0, {M}) of "
                         f"{num_steps} steps (need 1 <= window_size <= sampler.num_steps - 2)")
    if shift_interval < 1 or stride < 1:
        raise ValueError(f"train.window_shift_interval {shift_interval} and train.window_stride {stride} must be >= 1")
    positions = M // stride + 1
    start = ((step // shift_interval) % positions) * stride
    return min(start, M - window_size)


NFT_TIMESTEP_FRACTION = 0.99  # DiffusionNFT config/base.py train.timestep_fraction (its recipes keep it)


def nft_train_count(num_steps: int, timesteps: int | None = None) -> int:
    """K, the training timesteps per sample of DiffusionNFT (``train.nft_timesteps``; None: the reference's
    ``num_train_timesteps = int(num_steps * timestep_fraction)`` with its 0.99, i.e. 9 of 10, at least 1). They
    are drawn without replacement from the T points of the sampling schedule (``algo.nft``), so K <= T."""
    k = max(int(num_steps * NFT_TIMESTEP_FRACTION), 1) if timesteps is None else int(timesteps)
    if not 1 <= k <= num_steps:
        raise ValueError(f"train.nft_timesteps {k} must be in [1, sampler.num_steps = {num_steps}] (each sample's "
                         "training timesteps are distinct points of the sampling schedule)")
    return k


def nft_plan(num_steps: int, timesteps: int | None = None) -> TimestepPlan:
    """DiffusionNFT's plan: no SDE step (the sampler integrates the ODE, records no transition) and K training
    *slots* 0..K-1 in place of trained denoising steps (a cell is (sample, slot j); its timestep is drawn per
    sample in ``algo.nft``), so S = K for the grid, the scheduler and the cost model."""
    return TimestepPlan(sde_steps=(), trained=tuple(range(nft_train_count(num_steps, timesteps))))
