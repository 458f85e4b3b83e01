"""The virtual executor's jitter per action kind (the measured per-op spread of benchmarks/op_jitter.py)."""

from __future__ import annotations

import math

import pytest

from digenrl.schedule import Durations, StepPlan
from digenrl.sim.executor import VirtualExecutor, simulate


class Lin:
    def time(self, op: str, batch: int, pool: str) -> float:
        return {"denoise": 0.1 * batch, "train_chunk": 0.05 + 0.02 * batch, "allreduce": 0.1, "optimizer": 0.05,
                "publish": 0.2}.get(op, 0.0)


PLAN = StepPlan(prompts=3, generations=4, fragment_size=2, trained_timesteps=2, sampling_steps=3,
                chunk_generations=2, chunk_timesteps=1, generators=("g0", "g1"), trainers=("t0", "t1"),
                mode="gap_tsp", steps=3)


def _durations(res, kind):
    return [s.end - s.start for s in res.spans if s.kind == kind]


def test_only_the_jittered_kind_varies():
    cost = Lin()
    d = Durations(PLAN, cost)
    res = simulate(PLAN, cost, jitter={"train": 0.3}, seed=4)
    gens = _durations(res, "generate")
    assert gens and all(g == pytest.approx(d.generate(2, False, False), rel=1e-12) for g in gens)
    trains = _durations(res, "train")
    exact = d.train(2)
    logs = [math.log(t / exact) for t in trains]
    assert len(trains) == PLAN.steps * PLAN.prompts * 4 and max(abs(x) for x in logs) > 0.05
    # the draws are N(0, 0.3^2) in log space: their spread is near 0.3 (24 draws; loose band)
    sd = math.sqrt(sum(x * x for x in logs) / len(logs))
    assert 0.15 < sd < 0.5


def test_scalar_jitter_is_unchanged_and_seeded():
    a = simulate(PLAN, Lin(), jitter=0.2, seed=1)
    b = simulate(PLAN, Lin(), jitter=0.2, seed=1)
    c = simulate(PLAN, Lin(), jitter=0.2, seed=2)
    assert a.makespan == b.makespan != c.makespan
    assert simulate(PLAN, Lin(), jitter={}, seed=1).makespan == simulate(PLAN, Lin()).makespan


def test_bad_jitter_is_rejected():
    with pytest.raises(ValueError, match="unknown action kind 'trian'"):
        VirtualExecutor(PLAN, Lin(), {"trian": 0.1})
    with pytest.raises(ValueError, match="jitter"):
        VirtualExecutor(PLAN, Lin(), {"train": -0.1})
    with pytest.raises(ValueError, match="jitter"):
        VirtualExecutor(PLAN, Lin(), -0.1)
