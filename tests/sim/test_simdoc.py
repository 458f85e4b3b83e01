"""scripts/make_simulation_doc.py: everything goes where --out says, and the page's numbers come from its
results file (re-rendered from a copy of the committed results, with one value changed)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from script_loader import load_script

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "figures" / "simulation_results.json"


def _script():
    sys.path.insert(0, str(ROOT / "scripts"))
    return load_script("scripts/make_simulation_doc.py")


@pytest.mark.skipif(not RESULTS.exists(), reason="no committed results file")
def test_out_writes_page_figures_and_nothing_else(tmp_path):
    pytest.importorskip("matplotlib")
    before = {p: p.stat().st_mtime_ns for p in (ROOT / "docs").rglob("*") if p.is_file()}
    (tmp_path / "figures").mkdir()
    res = json.loads(RESULTS.read_text())
    # change one run's numbers: the page must show the new ones
    run = next(c for c in res["runs"] if (c["model"], c["testbed"], c["T"]) == ("hunyuan", "A", 20))
    full = next(r for r in run["rows"] if r["mode"] == "full")
    full["speedup_vs_colocated"] = 7.77
    full["speedup_vs_naive"] = 8.88
    (tmp_path / "figures" / "simulation_results.json").write_text(json.dumps(res))
    for name, _ in res.get("gantts", []):
        shutil.copy(ROOT / "docs" / "figures" / name, tmp_path / "figures" / name)
    out = tmp_path / "sim.md"
    assert _script().main(["--reuse", "--out", str(out)]) == 0
    page = out.read_text()
    assert "7.77x" in page and "8.88x" in page
    assert (tmp_path / "figures" / "ablation.png").exists() and (tmp_path / "figures" / "vs_colocated.png").exists()
    after = {p: p.stat().st_mtime_ns for p in (ROOT / "docs").rglob("*") if p.is_file()}
    assert after == before


def test_reuse_without_results_is_an_error(tmp_path, capsys):
    assert _script().main(["--reuse", "--out", str(tmp_path / "x.md")]) == 2
    assert "no results file" in capsys.readouterr().err and not (tmp_path / "x.md").exists()


BTS_RESULTS = ROOT / "benchmarks" / "results"


@pytest.mark.skipif(not (BTS_RESULTS / "bts_quality.json").exists(), reason="no committed BTS results")
def test_bts_section_numbers_come_from_the_bts_results_files():
    """The BTS section is rendered from the BTS benchmark results only: a changed value shows on the page, and
    the committed page's BTS section equals a fresh render of the committed results."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import simdoc_bts

    data = simdoc_bts.load(BTS_RESULTS)
    page = "\n".join(simdoc_bts.section(data))
    assert "## BTS decision quality" in page
    committed = (ROOT / "docs" / "simulation.md").read_text()
    assert page.strip() in committed
    data["quality"]["summary"]["exact/bts_d2"]["mean_vs_greedy"] = -0.4321
    data["agreement"]["pooled"]["d0_eq_d2"] = 0.123
    data["jitter"]["kinds"]["train"]["sigma_fast"] = 9.876
    online = data["online"]["summary"]
    online[next(k for k in online if k.endswith("/exact/online"))]["mean_vs_knowing"] = -0.5432
    data["depth"]["summary"]["d0"]["different_decisions"] = 4321
    changed = "\n".join(simdoc_bts.section(data))
    assert "-43.21%" in changed and "12%" in changed and "9.876" in changed and "-54.32%" in changed
    assert "depth 0 in 4321" in changed


def test_bias_section_reads_its_numbers_from_the_results_files(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    from simdoc_bias import section

    row = lambda mode, m, cal, s1, own, per: {  # noqa: E731
        "mode": mode, "step_time_s": m, "sim_step_time_s": cal, "sim_error": cal / m - 1, "sim_step1_s": s1,
        "sim_step1_error": s1 / m - 1, "sim_own_costs_s": own, "sim_own_costs_error": own / m - 1, "rounds": 3,
        "round_errors": per}
    rows = [row("naive", 5.0, 5.5, 5.1, 4.95, [0.31, -0.2, 0.1]), row("gap", 3.0, 2.7, 3.03, 2.97, [0.0, -0.1, -0.2])]
    (tmp_path / "pipeline_cpu.json").write_text(json.dumps(rows))
    text = "\n".join(section(tmp_path))
    assert "| naive | 5.000 | 5.500 (+10.0%) | 5.100 (+2.0%) | 4.950 (-1.0%) | +31% / -20% / +10% |" in text
    assert "from the calibration at most 10.0% off (1 of 2 optimistic), ranking equal to the measured one" in text
    assert "up to 31% off" in text and "mean of 3 interleaved runs" in text
    rows[1].update(sim_step_time_s=6.0, sim_error=1.0)  # gap predicted slower than naive: ranking not reproduced
    (tmp_path / "pipeline_cpu.json").write_text(json.dumps(rows))
    assert "from the calibration at most 100.0% off (0 of 2 optimistic), ranking not the measured one" in "\n".join(
        section(tmp_path))
