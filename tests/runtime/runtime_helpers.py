"""Helpers of the runtime tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

SMALL = ["steps=3", "train.prompts_per_step=2", "train.generations=4", "sampler.num_steps=4",
         "train.chunk_generations=2", "train.chunk_timesteps=2", "runtime.fragment_size=2",
         "eval.num_prompts=4", "eval.grid_prompts=4", "eval.every=0", "log.progress=false",
         "train.ema_decay=null",  # the checkpoints are the live weights (the oracle compares those)
         "tuning.calibration_repeats=1"]  # (TAG runs time their ops once; tests/runtime/test_profile.py times more)


def make_cfg(model_path, run_dir, *overrides):
    from digenrl.config import load_config

    return load_config(None, [f"model.path={model_path}", f"run_dir={run_dir}", *SMALL, *overrides])


class TiedReward:
    """Mean brightness of each image (float64), except the prompts in ``tied``: a constant 0.5 (about the others'
    mean), so their group ties (zero advantage with the group baseline: kept < B under the zero-advantage filter)."""

    name = "tied"

    def __init__(self, tied):
        self.tied = set(tied)

    def __call__(self, images, prompts):
        import torch

        r = images.double().flatten(1).mean(1)
        flat = torch.tensor([p.uid in self.tied for p in prompts])
        return torch.where(flat, torch.full_like(r, 0.5), r)


def tied_reward_server(steps: int, prompts: int = 3):
    """A loopback reward service (``rewards.service``) scoring with ``TiedReward``: the first prompt of each of the
    ``steps`` first steps ties, so the Ray workers and the reference loop score alike. A context manager."""
    from digenrl.rewards.service import RewardServer
    from digenrl.tasks.digits import DigitsTask

    cfg = make_cfg("unused", "unused")
    first = [DigitsTask().train_prompts(k, prompts, cfg.seed)[0].uid for k in range(steps)]
    return RewardServer(TiedReward(first))


def reference_run(tiny_model, run_dir, overrides, *, eval_weights: bool = False):
    """The reference's weights after ``steps`` (the eval weights, the EMA's where it keeps one, with
    ``eval_weights``) and its metric rows: the oracle of the invariance tests (``tests/reference``, written from
    the formulas)."""
    from reference import reference_run as run

    state, rows, _ = run(make_cfg(tiny_model, run_dir, *overrides), eval_weights=eval_weights)
    return state, rows


def run_matches(cfg, ref, rtol_tensor: float, rtol_global: float, label: str = ""):
    """Run ``cfg`` on Ray and check it against the reference's weights ``ref``: a clean audit, every step
    committed, and the run's committed parameters within ``rtol_tensor`` (max relative error per tensor) and
    ``rtol_global`` (the whole state) of ``ref``. Returns the run's summary."""
    from pathlib import Path

    from safetensors.torch import load_file
    from test_sharded_pool import _errors

    from digenrl.runtime.driver import run_training

    summary = run_training(cfg, ray=True)
    assert summary["audit_violations"] == [] and summary["version"] == cfg.steps
    per, glob = _errors(load_file(str(Path(cfg.run_dir) / "checkpoint.safetensors")), ref)
    print(f"{label}: max relative error per tensor {per:.2e}, global {glob:.2e}")
    assert per <= rtol_tensor and glob <= rtol_global, (per, glob)
    return summary


# the scheduler's actions (an eval / checkpoint side call may run on rank 0 while the scheduler still counts it
# in a publish: an object-store publish holds rank 0 until every generator has the version, as the simulator counts)
ACTION_KINDS = ("generate", "tag", "train", "commit", "publish")


def check_one_clock(trace_path, clock_error_s: float) -> int:
    """A run's trace is on one clock (``runtime.clocks``): on every worker's row the spans of its actions (the
    worker's own stamps mapped onto the driver's clock, and the driver's publish spans) follow one another without
    overlap, to within twice the run's clock error bound. A wall clock stepped while the run went on, or stamps
    left on the worker's clock, overlap a commit with the publish the driver launched on seeing it. Returns the
    rows checked."""
    from collections import defaultdict

    from digenrl.observe.trace import read_chrome_trace

    rows = defaultdict(list)
    for s in read_chrome_trace(trace_path):
        if s.kind in ACTION_KINDS:
            rows[s.worker].append(s)
    tol = 2.0 * clock_error_s + 2e-6  # (+ the trace's microsecond rounding)
    for w, spans in rows.items():
        spans.sort(key=lambda s: (s.start, s.end))
        for a, b in zip(spans, spans[1:]):
            assert b.start >= a.end - tol, f"{w}: {a.kind} {a.label!r} ends {a.end - b.start:.6f} s after " \
                                           f"{b.kind} {b.label!r} starts (clock error bound {clock_error_s:.6f} s)"
    return len(rows)
