"""scripts/tcss_curves.py: aggregation, differences, Markdown and figure on a synthetic results file (no training)."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import mean

import pytest

from script_loader import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tc():
    return load_script("scripts/tcss_curves.py")


CURVES = {  # (variant, seed) -> eval reward at steps 0, 20, 40
    ("reference", 0): [0.5, 0.8, 1.0],
    ("reference", 1): [0.3, 0.6, 0.9],
    ("full_0.25", 0): [0.5, 0.7, 0.98],
    ("full_0.25", 1): [0.3, 0.5, 0.96],
    ("full_0.5", 0): [0.52, 0.79, 0.99],
    ("full_0.5", 1): [0.31, 0.62, 0.93],
}
STEPS = [0, 20, 40]


def _results() -> dict:
    runs = []
    for (v, s), ys in CURVES.items():
        curve = [[st, y] for st, y in zip(STEPS, ys)]
        if (v, s) == ("full_0.5", 1):
            curve.insert(1, [10, 0.4])  # a step only one seed has: left out of the mean
        stale = {"reference": 0.0, "full_0.25": 0.2, "full_0.5": 0.4}[v] + 0.01 * s
        runs.append({"variant": v, "seed": s, "eval_curve": curve, "eval_final": ys[-1], "wall_s": 100.0 + s,
                     "summary": {"stale_fraction": stale}})
    return {"runs": runs}


def test_aggregate_mean_and_band(tc):
    agg = tc.aggregate(_results())
    assert list(agg) == ["reference", "full_0.25", "full_0.5"]
    for v, a in agg.items():
        assert a["seeds"] == [0, 1] and a["steps"] == STEPS
        for i in range(len(STEPS)):
            ys = [CURVES[(v, 0)][i], CURVES[(v, 1)][i]]
            assert a["mean"][i] == pytest.approx(mean(ys))
            assert a["min"][i] == min(ys) and a["max"][i] == max(ys)
        assert a["final"] == {0: CURVES[(v, 0)][-1], 1: CURVES[(v, 1)][-1]}


def test_differences_and_markdown(tc):
    agg = tc.aggregate(_results())
    diffs = tc.differences(agg, threshold=0.05)
    # full_0.25 mean - reference mean per step: 0.0, -0.1, +0.02 -> only step 20 exceeds 0.05
    ref_mean = [mean([CURVES[("reference", 0)][i], CURVES[("reference", 1)][i]]) for i in range(3)]
    f25_mean = [mean([CURVES[("full_0.25", 0)][i], CURVES[("full_0.25", 1)][i]]) for i in range(3)]
    assert [s for s, _ in diffs["full_0.25"]] == [20]
    assert diffs["full_0.25"][0][1] == pytest.approx(f25_mean[1] - ref_mean[1])
    assert diffs["full_0.5"] == []
    md = tc.markdown(agg, threshold=0.05)
    assert f"step 20 ({f25_mean[1] - ref_mean[1]:+.3f})" in md
    assert "at 2 of 3 shared eval steps" in md
    assert "**full_0.5** agrees with the reference" in md
    fin = {v: mean([CURVES[(v, 0)][-1], CURVES[(v, 1)][-1]]) for v in ("reference", "full_0.25", "full_0.5")}
    assert f"mean final eval differs by {fin['full_0.25'] - fin['reference']:+.3f}" in md
    row = next(ln for ln in md.splitlines() if ln.startswith("| full_0.25 |"))
    assert row == f"| full_0.25 | 0.980 | 0.960 | {fin['full_0.25']:.3f} | 0.200, 0.210 | 100-101 s |"
    f5_gap = max(abs(mean([CURVES[("full_0.5", 0)][i], CURVES[("full_0.5", 1)][i]]) - ref_mean[i]) for i in range(3))
    assert f"(largest {f5_gap:.3f} at step" in md
    assert "Not run" not in md
    g25 = max(abs(CURVES[("full_0.25", sd)][i] - CURVES[("reference", sd)][i]) for sd in (0, 1) for i in range(3))
    assert f"Same seed, same step: largest difference {g25:.3f}" in md.split("**full_0.5**")[0]


def test_markdown_names_missing_runs(tc):
    res = _results()
    res["runs"] = [r for r in res["runs"] if (r["variant"], r["seed"]) != ("full_0.5", 1)]
    agg = tc.aggregate(res)
    assert agg["full_0.5"]["seeds"] == [0] and agg["full_0.5"]["mean"] == CURVES[("full_0.5", 0)]
    md = tc.markdown(agg)
    assert "Not run (left out of the means): full_0.5 seed 1." in md
    row = next(ln for ln in md.splitlines() if ln.startswith("| full_0.5 |"))
    assert row.startswith("| full_0.5 | 0.990 | not run | 0.990 |")


def test_store_replaces_and_appends(tc, tmp_path):
    path = tmp_path / "r.json"
    res = tc.load(path)
    tc.store(res, {"variant": "reference", "seed": 1, "eval_final": 0.1}, path)
    tc.store(res, {"variant": "reference", "seed": 0, "eval_final": 0.2}, path)
    tc.store(res, {"variant": "reference", "seed": 1, "eval_final": 0.3}, path)
    on_disk = json.loads(path.read_text())
    assert [(r["seed"], r["eval_final"]) for r in on_disk["runs"]] == [(0, 0.2), (1, 0.3)]


def test_variant_overrides(tc):
    assert tc.variant_overrides("reference") == []
    assert "runtime.max_stale_fraction=0.5" in tc.variant_overrides("full_0.5")
    assert "runtime.mode=full" in tc.variant_overrides("full_0.25")
    with pytest.raises(ValueError, match="variant"):
        tc.variant_overrides("gap")


def test_figure_written(tc, tmp_path):
    out = tmp_path / "f.png"
    tc.figure(tc.aggregate(_results()), out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
