"""The presets' hardware table (docs/presets.md) and the scaling table (docs/scaling.md) are what
``scripts/presets_doc.py`` writes from the presets and the results file now: a preset whose pools or memory plan
change without the pages being regenerated fails here (the lead re-runs the script at merge)."""

from __future__ import annotations

import json

from script_loader import ROOT, load_script


def test_pages_are_up_to_date():
    doc = load_script("scripts/presets_doc.py")
    assert doc.main(["--check"]) == 0, "run python scripts/presets_doc.py"


def test_every_preset_has_its_row_with_its_pools():
    from digenrl.config import load_config
    from digenrl.presets import preset_names, preset_path

    text = (ROOT / "docs" / "presets.md").read_text()
    names = preset_names()
    assert len(names) >= 8
    for name in names:
        rt = load_config(preset_path(name)).runtime
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
        pools = "(colocated)" if rt.mode == "colocated" else f"({rt.generators} + {rt.trainers})"
        assert pools in row and f"| {rt.mode} |" in row, row


def test_scaling_table_reads_the_results_file(tmp_path, monkeypatch):
    doc = load_script("scripts/presets_doc.py")
    results = {"testbed": "B", "presets": {"p": [
        {"gpus": 1, "mode": "colocated", "plan": "1 coloc", "step_time_s": 100.4, "colocated_s": None},
        {"gpus": 2, "mode": "gap_tsp_tag", "plan": "1+1", "step_time_s": 60.6, "colocated_s": 75.0},
        {"gpus": 4, "refused": "exit 2"}]}}
    table = doc.scaling_table(results)
    assert "| `p` | 1 | colocated | 1 coloc | 100 s | (is colocated) |" in table
    assert "| `p` | 2 | gap_tsp_tag | 1+1 | 61 s | 75 s |" in table
    assert "| `p` | 4 | refused (exit 2) |" in table
    saved = json.loads((ROOT / "benchmarks" / "results" / "preset_scaling.json").read_text())
    assert set(saved["presets"]) == set(doc.SCALED) and [r["gpus"] for r in saved["presets"]["flux1_dev"]] == [1, 2, 4]
