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


def _pool_report(steps: dict[str, list[float]]) -> dict:
    """A ``fast_pool_cpu.json`` of the given per-round step times (simulated = measured + 1%)."""
    names = [n for n in ("colocated", "colocated_flow_grpo", "gap_tsp_tag", "gap_tsp_tag_fast", "full_fast")
             if n in steps]
    rows = []
    for name in names:
        mean = sum(steps[name]) / len(steps[name])
        rows.append({"variant": name, "overrides": ["sampler.batch_size=3"] if name == "colocated_flow_grpo" else [],
                     "step_time_s": mean, "round_step_times_s": steps[name], "efficiency": 0.9,
                     "tag_fragments_per_step": 1.0, "stale_fraction": 0.0, "sim_step_time_s": mean * 1.01,
                     "sim_error": 0.01,
                     "round_load_avg_1m_before": [0.5, 1.5],
                     "speedup_vs_colocated": sum(steps["colocated"]) / len(steps["colocated"]) / mean,
                     "round_speedups_vs_colocated": [c / s for c, s in zip(steps["colocated"], steps[name])]})
    return {"rounds": 2, "steps": 8, "workload": ["train.generations=4", "sampler.num_steps=10",
                                                     "train.timestep_fraction=0.2", "train.prompts_per_step=2",
                                                     "runtime.fragment_size=2"], "rows": rows}


def test_the_generator_pool_headline_says_what_the_results_say():
    """The README's sentence on the generator pool against colocation is written from the results file: which side
    is faster, by how much, and whether the rounds tell them apart, so a run where colocation wins reads so."""
    pool = load_script("benchmarks/fast_pool_cpu.py")
    wins = pool.headline(_pool_report({"colocated": [10.0, 10.2], "gap_tsp_tag": [10.5, 10.7],
                                       "gap_tsp_tag_fast": [8.0, 8.2], "full_fast": [7.6, 7.8]}))
    assert "`gap_tsp_tag` (the same math) **1.25x** with a merged, compiled generator (1.24-1.25x per round; the " \
           "difference is more than twice its standard error) and 0.95x with an eager, unmerged one" in wins
    # full's rounds: 10.0 / 7.6 and 10.2 / 7.8 (a slow round shows beside the mean)
    assert "`full` (TCSS: some samples one version stale) **1.31x** (1.31-1.32x per round)" in wins
    assert "load 0.5-1.5" in wins and "2 prompts x 4 generations, T = 10 of which 2 trained" in wins
    assert "fragments of 2 + 1 trainer" in wins
    assert "each sampling its whole share, 4 trajectories, in one batch" in wins
    assert "measured: full_fast < gap_tsp_tag_fast < colocated < gap_tsp_tag" in wins
    loses = pool.headline(_pool_report({"colocated": [10.0, 10.4], "gap_tsp_tag": [11.0, 11.2],
                                        "gap_tsp_tag_fast": [10.6, 10.0], "full_fast": [10.0, 10.2]}))
    assert "**0.99x** with a merged, compiled generator (0.94-1.04x per round; the difference is not more than " \
           "twice" in loses and "**1.01x** (1.00-1.02x per round) with the fast generator" in loses
    assert "measured: full_fast < colocated < gap_tsp_tag_fast < gap_tsp_tag" in loses
    assert "flow_grpo" not in loses  # a results file without the peer-batched row (written before it existed)
    report = _pool_report({"colocated": [10.0, 10.4], "colocated_flow_grpo": [11.0, 11.4], "gap_tsp_tag": [11.0, 11.2],
                           "gap_tsp_tag_fast": [10.6, 10.0], "full_fast": [10.0, 10.2]})
    peer = pool.headline(report)
    assert ("Against colocated batched as flow_grpo's FLUX recipe (sampling 3 at a time, one timestep per "
            "forward/backward; 0.91x the speed of colocation as DigenRL runs it): `gap_tsp_tag` (the same math) with "
            "the fast generator **1.09x** (1.04-1.14x per round), `full` **1.11x** (1.10-1.12x per round).") in peer
    assert pool.peer_sentence(report, workload=True).startswith(
        "On this CPU with 2 prompts per step and fragments of 2 (`python benchmarks/fast_pool_cpu.py --prompts 2 "
        "--fragment 2`, 2 interleaved rounds of 8 steps), against colocated batched as flow_grpo's")
    del report["rows"][1]
    assert pool.peer_sentence(report, workload=True) == ""
    assert "| `colocated` | 2 workers" in pool.table(_pool_report({n: [1.0, 1.1] for n in pool.VARIANTS}))
