"""The TSP chunk shape on a shard group, checked against the simulator, and the per-rank idle statistic.

Oracle: the scheduler itself, run in virtual time on one group for every shape the memory allows; the shape
``layout.choose_chunk_shape`` picks must train the group as fast as the fastest of them. A cost with a fixed
price per chunk (the parameter gathers of a collective) and a per-rank share makes small chunks pay rounds and
large chunks pay partial rounds, which is what a rule that treats the shard group as one GPU gets wrong.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from digenrl.control.timeline import RunResult, idle_share, rank_busy
from digenrl.observe.trace import Span
from digenrl.schedule import StepPlan
from digenrl.schedule.actions import Size
from digenrl.schedule.layout import busy_share, choose_chunk_shape, rank_share
from digenrl.sim.executor import simulate


class GroupCost:
    """Only training costs: a chunk of c cells on a group of ``ranks`` = fixed + per_round x ceil(c / ranks)."""

    def __init__(self, ranks: int, fixed: float, per_round: float):
        self.ranks, self.fixed, self.per_round = ranks, fixed, per_round

    def time(self, op: str, batch: int, pool: str) -> float:
        if op == "train_chunk":
            return self.fixed + self.per_round * math.ceil(batch / self.ranks)
        return 1e-6 if op == "denoise" else 0.0


def _group_seconds(g: int, s: int, ranks: int, cost: GroupCost, cg: int, cs: int) -> float:
    """The scheduler in virtual time: one step of one group, one fragment, one shard group of ``ranks``."""
    plan = StepPlan(prompts=1, generations=g, fragment_size=g, trained_timesteps=s, sampling_steps=s,
                    chunk_generations=cg, chunk_timesteps=cs, generators=("g0",), trainers=("shard0",),
                    mode="gap_tsp", steps=1, shard_ranks=ranks)
    return simulate(plan, cost, record=False).makespan


@settings(max_examples=25, deadline=None)
@given(g=st.integers(1, 8), s=st.integers(1, 6), ranks=st.integers(2, 12), fixed=st.sampled_from([0.0, 0.3, 2.0]),
       cap=st.integers(1, 4))
def test_chosen_shape_is_the_fastest_the_scheduler_runs(g, s, ranks, fixed, cap):
    cost = GroupCost(ranks, fixed, 1.0)
    max_cells = cap * ranks
    cg, cs = choose_chunk_shape(g, s, 1, lambda c: cost.time("train_chunk", c, "trainer"), max_cells)
    assert cg * cs <= max_cells
    times = {(a, b): _group_seconds(g, s, ranks, cost, a, b)
             for a in range(1, g + 1) for b in range(1, s + 1) if a * b <= max_cells}
    assert _group_seconds(g, s, ranks, cost, cg, cs) == pytest.approx(min(times.values()), rel=1e-9, abs=1e-9)


def test_hunyuan_like_grid_prefers_whole_rounds_over_small_chunks():
    # 12 x 12 cells on 20 ranks, 0.3 s per chunk: two chunks of 72 cells (4 rounds each) beat eight of 18
    # (one round each), which a score of (chunks + 1) x chunk time picks
    cost = GroupCost(20, 0.3, 1.0)
    cg, cs = choose_chunk_shape(12, 12, 1, lambda c: cost.time("train_chunk", c, "trainer"), 80)
    assert _group_seconds(12, 12, 20, cost, cg, cs) == pytest.approx(8 + 2 * 0.3, abs=1e-4)
    assert _group_seconds(12, 12, 20, cost, 3, 6) == pytest.approx(8 + 8 * 0.3, abs=1e-4)


def test_rank_share_and_busy_share():
    assert [rank_share(c, 4) for c in (1, 4, 5, 8, 9)] == [1, 1, 2, 2, 3]
    assert busy_share(18, 20) == pytest.approx(0.9)
    assert busy_share(40, 20) == 1.0 and busy_share(5, 1) == 1.0
    assert busy_share(9, 4) == pytest.approx(9 / 12)


def test_idle_counts_the_ranks_waiting_inside_a_collective_chunk():
    plan = StepPlan(prompts=1, generations=4, fragment_size=4, trained_timesteps=2, sampling_steps=2,
                    chunk_generations=3, chunk_timesteps=1, generators=("g0",), trainers=("shard0",),
                    mode="gap_tsp", steps=1, shard_ranks=4)
    spans = [Span("shard0", "train", 0.0, 1.0, "s0 g0 3 cells", "trainer", Size(cells=3)),
             Span("shard0", "train", 1.0, 2.0, "s0 g0 1 cells", "trainer", Size(cells=1)),
             Span("shard0", "commit", 2.0, 3.0, "commit s0", "trainer"),
             Span("shard0", "idle", 3.0, 4.0, "", "trainer")]
    # busy rank-seconds: 3/4 + 1/4 + 1 (the commit: every rank) = 2 of 4
    assert idle_share(spans, ("shard0",), 0.0, 4.0, rank_busy(plan)) == pytest.approx(0.5)
    assert idle_share(spans, ("shard0",), 0.0, 4.0) == pytest.approx(0.25)  # the worker-level view
    res = RunResult(plan, spans, 4.0, [], None)
    assert res.trainer_idle == pytest.approx(0.5)
