"""Fragments and chunk tilings: every generation and every cell exactly once."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from digenrl.schedule import classic_chunks, group_fragments, tsp_chunks
from digenrl.schedule.layout import grid_cells
from sched_helpers import make_plan


@settings(max_examples=200, deadline=None)
@given(g=st.integers(1, 9), f=st.integers(1, 9), s=st.integers(1, 6), cg=st.integers(1, 9),
       cs=st.integers(1, 6), n=st.integers(1, 7), p=st.integers(1, 4),
       mode=st.sampled_from(["naive", "gap", "gap_tsp", "colocated"]))
def test_tilings_partition_the_grid(g, f, s, cg, cs, n, p, mode):
    plan = make_plan(mode, prompts=p, generations=g, fragment_size=min(f, g), S=s, T=s, cg=min(cg, g),
                     cs=min(cs, s), n_train=n)
    for grp in range(p):
        gens = Counter(i for fr in group_fragments(plan, 3, grp) for i in fr.generations)
        assert gens == Counter(range(g))
        chunks = tsp_chunks(plan, 3, grp) if plan.mode.tsp else [
            c for cs_ in classic_chunks(plan, 3, grp).values() for c in cs_]
        cells = Counter(cell for c in chunks for cell in c.cells)
        assert set(cells) == {(i, j) for _, i, j in grid_cells((0,), g, s)} and set(cells.values()) == {1}
        assert all(c.step == 3 and c.group == grp for c in chunks)


def test_tsp_tiling_is_timestep_major():
    plan = make_plan("gap_tsp", generations=4, S=3, T=3, cg=2, cs=2)
    chunks = tsp_chunks(plan, 0, 0)
    assert [c.cells for c in chunks] == [
        ((0, 0), (1, 0), (0, 1), (1, 1)), ((2, 0), (3, 0), (2, 1), (3, 1)), ((0, 2), (1, 2)), ((2, 2), (3, 2))]


def test_classic_shards():
    # barrier modes: contiguous shards of the step's B = 8 trajectories over 4 ranks
    plan = make_plan("naive", prompts=2, generations=4, n_train=4)
    assert {r: [c.cells for c in v][:1] for r, v in classic_chunks(plan, 0, 1).items()} == {
        2: [((0, 0), (1, 0))], 3: [((2, 0), (3, 0))]}
    # gap: every group spread over all ranks
    plan = make_plan("gap", prompts=2, generations=4, n_train=4)
    assert sorted(classic_chunks(plan, 0, 1)) == [0, 1, 2, 3]
