"""The generated benchmark tables (docs/benchmarks.md, the demo table of docs/getting_started.md and README.md, the
sequence-parallel tables of docs/sequence_parallel.md) are what ``scripts/benchmarks_doc.py`` prints from the results
files now."""

from __future__ import annotations

import json

import pytest

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


def _junit(path, cases: dict[tuple[str, str], float], failures: int = 0):
    """A pytest-style JUnit report of ``{(module, name): seconds}``."""
    body = "".join(f'<testcase classname="{m}" name="{n}" time="{t}"/>' for (m, n), t in cases.items())
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="{len(cases)}" '
                    f'failures="{failures}" errors="0" skipped="0">{body}</testsuite></testsuites>')
    return path


def test_suite_time_compares_the_tests_both_versions_have(tmp_path):
    """benchmarks/suite_time.py: the ratio is over the tests both versions have (by module and name); a test one
    version lacks is counted apart, whatever its time, so a suite that grew by tests does not read as slower code."""
    bench = load_script("benchmarks/suite_time.py")
    old, counts = bench.read_junit(_junit(tmp_path / "old.xml", {("tests.a", "t1"): 10.0, ("tests.a", "t2"): 4.0,
                                                                 ("tests.b", "gone"): 7.0}, failures=1))
    new, _ = bench.read_junit(_junit(tmp_path / "new.xml", {("tests.a", "t1"): 8.0, ("tests.a", "t2"): 5.0,
                                                            ("tests.c", "added"): 30.0}))
    assert counts == {"tests": 3, "failures": 1, "errors": 0, "skipped": 0}
    c = bench.compare(old, new)
    assert (c["common_tests"], c["common_old_s"], c["common_new_s"]) == (2, 14.0, 13.0)
    assert c["common_new_over_old"] == 13.0 / 14.0
    assert (c["only_old_tests"], c["only_old_s"], c["only_new_tests"], c["only_new_s"]) == (1, 7.0, 1, 30.0)
    assert c["only_new_by_module"] == [{"module": "tests.c", "s": 30.0}]
    pair = {"old_commit": "aaa", "new_commit": "bbb", "order": "old-new", "cpus": 2, "comparison": c,
            "runs": {k: {"tests": 3, "failures": f, "errors": 0, "wall_s": 600.0, "sum_s": s, "loadavg_1min_before": 0.5}
                     for k, f, s in (("old", 1, 21.0), ("new", 0, 43.0))}}
    text = bench.markdown({"pairs": [pair], "summary": bench.summary([pair])})
    assert "| old | `aaa` | 3 (1) | 10.0 min | 21 s | 0.50 |" in text
    assert "the 2 tests both have took 14 s (old) and 13 s (new): new / old = **0.929**." in text
    assert "Common tests that got slower, by module: none." in text  # tests.a: 14 -> 13 s in all (t2 alone: 4 -> 5)
    assert "geometric mean" not in text  # (one pair)
    # a second pair the other way round, whose common tests took 1.2x: the geometric mean of 13/14 and 1.2
    other = {**pair, "order": "new-old", "comparison": {**c, "common_new_over_old": 1.2}}
    two = bench.summary([pair, other])
    assert two["geometric_mean"] == pytest.approx((13 / 14 * 1.2) ** 0.5) and two["orders"] == ["old-new", "new-old"]
    assert "(0.929, 1.200): geometric mean **1.056**" in bench.markdown({"pairs": [pair, other], "summary": two})


def test_suite_time_appends_only_a_pair_of_the_same_commits(tmp_path, capsys):
    """--append onto a results file of other commits is refused before any suite runs (the geometric mean of pairs
    of different code would measure nothing), naming the file and both commit pairs; the file is left as it was."""
    bench = load_script("benchmarks/suite_time.py")
    trees = []
    for name in ("old", "new"):  # source trees outside git: their commit reads "?"
        (tmp_path / name / "src" / "digenrl").mkdir(parents=True)
        (tmp_path / name / "Makefile").write_text("test:\n\tfalse\n")
        trees += [f"--{name}", str(tmp_path / name)]
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").write_text("")
    out = tmp_path / "suite_time.json"
    saved = json.dumps({"pairs": [{"old_commit": "aaa", "new_commit": "bbb"}]})
    out.write_text(saved)
    with pytest.raises(SystemExit) as e:
        bench.main([*trees, "--append", "--venv", str(tmp_path / "venv"), "--out", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"--append: {out} holds pairs of [('aaa', 'bbb')] (old, new), not of ('?', '?')" in err
    assert out.read_text() == saved
