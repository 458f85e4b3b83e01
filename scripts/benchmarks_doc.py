"""Fill the generated tables of the docs and the README from the results files, with each benchmark's own table
function: docs/benchmarks.md (CPU pipeline, publish paths, plan validation), docs/getting_started.md and
README.md (the demo's seeds), docs/sequence_parallel.md (``benchmarks/sp_native.py``'s tables), docs/fast_generator.md
and README.md (``benchmarks/fast_pool_cpu.py``: the generator pool against colocation, end to end).

    python scripts/benchmarks_doc.py            # rewrite the marked blocks
    python scripts/benchmarks_doc.py --check    # exit 1 if a block is not what this script writes

A block is ``<!-- BEGIN bench:NAME (scripts/benchmarks_doc.py) -->`` ... ``<!-- END bench:NAME -->``; only its
inside is replaced.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGES = [ROOT / "docs" / "benchmarks.md", ROOT / "docs" / "getting_started.md", ROOT / "docs" / "fast_generator.md",
         ROOT / "docs" / "sequence_parallel.md", ROOT / "README.md"]
BLOCK = re.compile(r"(<!-- BEGIN bench:(\w+) \(scripts/benchmarks_doc.py\) -->\n)(.*?)(<!-- END bench:\2 -->)", re.S)


def _load(relative: str):
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _json(name: str):
    return json.loads((RESULTS / name).read_text())


def block(name: str) -> str:
    """The Markdown of block ``name``, from its results file."""
    if name == "demo_seeds":
        return _load("scripts/demo_seeds.py").table(_json("demo_seeds.json"))
    if name == "demo_seeds_fast":
        return _load("scripts/demo_seeds.py").table(_json("demo_seeds_fast.json"))
    if name == "pipeline_cpu":
        return _load("benchmarks/pipeline_cpu.py").markdown_table(_json("pipeline_cpu.json"))
    if name == "publish_cpu":
        return _load("benchmarks/publish_cpu.py").markdown(_json("publish_cpu.json"))
    if name == "plan_validation":
        return _load("benchmarks/plan_validation.py").markdown_table(_json("plan_validation.json"))
    if name == "fast_generator":
        return _load("benchmarks/fast_generator.py").headline(_json("fast_generator.json"))
    if name == "fast_pool_cpu_headline":  # the README's: the default workload's sentence
        return _load("benchmarks/fast_pool_cpu.py").headline(_json("fast_pool_cpu.json"))
    if name == "fast_pool_cpu_p8_f4_peer":  # the README's: 8 prompts against flow_grpo's batches
        return _load("benchmarks/fast_pool_cpu.py").peer_sentence(_json("fast_pool_cpu_p8_f4.json"), workload=True)
    if name.startswith("fast_pool_cpu"):  # fast_pool_cpu[_p<N>][_f<F>]: --prompts N --fragment F
        return _load("benchmarks/fast_pool_cpu.py").table(_json(f"{name}.json"))
    if name == "where_wins":
        return _load("benchmarks/where_wins.py").summary(_json("where_wins.json"))
    if name == "sp_native":
        return _load("benchmarks/sp_native.py").table(_json("sp_native.json")["rows"])
    if name == "demo_wall":
        return _load("benchmarks/demo_wall.py").markdown(_json("demo_wall.json"))
    if name == "suite_time":
        return _load("benchmarks/suite_time.py").markdown(_json("suite_time.json"))
    raise ValueError(f"unknown block bench:{name}")


def render(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + "\n" + block(m.group(2)).strip() + "\n\n" + m.group(4), text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a block is out of date")
    args = ap.parse_args(argv)
    stale = []
    for page in PAGES:
        text = page.read_text()
        new = render(text)
        if new == text:
            continue
        if args.check:
            stale.append(str(page.relative_to(ROOT)))
        else:
            page.write_text(new)
            print(f"wrote {page.relative_to(ROOT)}")
    if stale:
        print(f"{', '.join(stale)}: out of date: run python scripts/benchmarks_doc.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
