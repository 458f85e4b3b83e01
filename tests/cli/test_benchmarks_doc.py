"""The generated benchmark tables (docs/benchmarks.md, the demo table of docs/getting_started.md and README.md, the
sequence-parallel tables of docs/sequence_parallel.md) are what ``scripts/benchmarks_doc.py`` prints from the results
files now."""

from __future__ import annotations

import json

from script_loader import ROOT, load_script


def test_blocks_are_up_to_date():
    assert load_script("scripts/benchmarks_doc.py").main(["--check"]) == 0, "run python scripts/benchmarks_doc.py"


def test_demo_rows_come_from_the_results_file():
    runs = json.loads((ROOT / "benchmarks" / "results" / "demo_seeds.json").read_text())["runs"]
    for page in ("README.md", "docs/getting_started.md"):
        text = (ROOT / page).read_text()
        for r in runs:
            assert f"| {r['seed']} | {r['eval_initial']:.3f} | {r['eval_final']:.3f} |" in text, (page, r["seed"])


def test_a_stale_block_is_rewritten(tmp_path):
    doc = load_script("scripts/benchmarks_doc.py")
    stale = ("x\n<!-- BEGIN bench:demo_seeds (scripts/benchmarks_doc.py) -->\n| old |\n"
             "<!-- END bench:demo_seeds -->\ny\n")
    new = doc.render(stale)
    assert "| old |" not in new and "| seed | base generator |" in new and new.endswith("<!-- END bench:demo_seeds -->\ny\n")
