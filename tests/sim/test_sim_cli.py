"""``digenrl simulate`` (sim.cli.main): JSON rows, files, and refusal of bad input with exit code 2."""

from __future__ import annotations

import json

import pytest

from digenrl.sim.cli import main
from digenrl.control.profile import save_profile
from tabulated_profile import tabulate

ROW_KEYS = ("mode", "step_time_s", "speedup_vs_naive", "speedup_vs_colocated", "gen_idle", "trainer_idle",
            "stale_fraction")  # what every --json row carries

SMALL = ["--model", "flux", "--testbed", "B", "--gpus", "8", "--steps", "2", "--prompts", "4",
         "--generations", "8", "--sampling-steps", "10"]


def run_json(capsys, *extra):
    assert main(SMALL + ["--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_rows_have_the_required_keys_and_consistent_speedups(capsys):
    rows = run_json(capsys, "--gen-gpus", "3", "--modes", "colocated", "naive", "gap_tsp", "full")
    assert [r["mode"] for r in rows] == ["colocated", "naive", "gap_tsp", "full"]
    for r in rows:
        assert set(ROW_KEYS) <= set(r)
        assert 0.0 <= r["gen_idle"] <= 1.0 and 0.0 <= r["trainer_idle"] <= 1.0
    by = {r["mode"]: r for r in rows}
    assert by["naive"]["speedup_vs_naive"] == pytest.approx(1.0)
    assert by["colocated"]["speedup_vs_colocated"] == pytest.approx(1.0)
    for r in rows:
        assert r["speedup_vs_naive"] == pytest.approx(by["naive"]["step_time_s"] / r["step_time_s"])
        assert r["speedup_vs_colocated"] == pytest.approx(by["colocated"]["step_time_s"] / r["step_time_s"])
    assert by["gap_tsp"]["gen_gpus"] == 3 and by["gap_tsp"]["trainer_gpus"] == 5
    assert by["naive"]["stale_fraction"] == 0.0 and 0.0 < by["full"]["stale_fraction"] <= 0.5


def test_split_is_searched_when_not_given(capsys):
    (row,) = run_json(capsys, "--modes", "gap_tsp")
    assert 1 <= row["gen_gpus"] <= 7 and row["gen_gpus"] + row["trainer_gpus"] == 8


def test_trace_and_gantt_files(tmp_path, capsys):
    trace, gantt = tmp_path / "t.json", tmp_path / "g.png"
    assert main(SMALL + ["--gen-gpus", "3", "--modes", "naive", "gap_tsp_tag", "--trace", str(trace),
                         "--gantt", str(gantt)]) == 0
    data = json.loads(trace.read_text())
    names = {e["args"]["name"] for e in data["traceEvents"] if e.get("name") == "thread_name"}
    assert names == {f"gen{i}" for i in range(3)} | {"shard0"}  # the FSDP trainer pool is one shard group
    kinds = {e["name"] for e in data["traceEvents"] if e["ph"] == "X"}
    assert {"generate", "train", "commit", "publish"} <= kinds
    assert gantt.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "gap_tsp_tag" in capsys.readouterr().out


@pytest.mark.parametrize("args, option", [
    (["--model", "sdxl", "--testbed", "A"], "--model"),
    (["--model", "flux", "--testbed", "Z"], "--testbed"),
    (["--model", "flux", "--testbed", "A", "--gpus", "8", "--gen-gpus", "8"], "--gen-gpus"),
    (["--model", "flux", "--testbed", "A", "--gpus", "64"], "--gpus"),
    (["--model", "flux", "--testbed", "A", "--modes", "gap", "turbo"], "--modes"),
    (["--model", "flux", "--testbed", "A", "--timestep-fraction", "0"], "--timestep-fraction"),
    (["--model", "flux", "--testbed", "A", "--profile", "/nonexistent/profile.json"], "--profile"),
    (["--model", "qwen-image", "--testbed", "A", "--gpus", "8", "--gen-gpus", "4", "--modes", "gap"],
     "--gen-gpus"),
    (["--model", "flux", "--testbed", "A", "--modes", "naive", "--trace-mode", "gap"], "--trace-mode"),
    (["--model", "flux", "--testbed", "A", "--nft-old-policy", "current"], "--nft-old-policy"),
    (["--model", "flux", "--testbed", "A", "--max-stale-fraction", "1.5"], "--max-stale-fraction"),
])
def test_bad_input_exits_2_naming_the_option_and_writes_nothing(tmp_path, capsys, args, option):
    trace, gantt = tmp_path / "t.json", tmp_path / "g.png"
    rc = main(args + ["--steps", "1", "--trace", str(trace), "--gantt", str(gantt)])
    err = capsys.readouterr().err
    assert rc == 2
    assert option in err
    assert not trace.exists() and not gantt.exists()


def test_argparse_errors_also_exit_2(capsys):
    assert main(["--model", "flux"]) == 2  # --testbed missing (checked by us: --config is the alternative)
    assert "--testbed" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--model", "flux", "--testbed", "A", "--gpus", "many"])
    assert e.value.code == 2
    assert "--gpus" in capsys.readouterr().err


FIGURES = ("step_time_s", "gen_idle", "trainer_idle", "stale_fraction", "tag_fragments_per_step")
SHAPE = ("gen_gpus", "trainer_gpus", "fragment_size", "chunk")


def _setup_small():
    from digenrl.sim.cli import _setup, build_parser

    return _setup(build_parser().parse_args(SMALL))


def _as_profiled(setup, run, tmp_path):
    """``setup`` priced by a profile tabulated from the roofline of ``run``'s candidate at every batch the plans
    use, measured at its trainer count, with the candidate's training settings (a profile prices only those)."""
    from dataclasses import replace

    from digenrl.control.profile import load_profile
    from digenrl.sim.scenario import make_cost, with_candidate

    c = run.candidate
    path = save_profile(tabulate(make_cost(setup, c, run.mode.value == "colocated"), range(1, 129), "roofline"),
                        tmp_path / f"{run.mode.value}.json")
    return replace(with_candidate(setup, c), profile=load_profile(path), profile_trainers=c.split.n_train)


def test_measured_profile_replaces_the_roofline(tmp_path):
    # a profile tabulated from the roofline of the plan the planner chose, at every batch the plans use, prices
    # every action exactly as the roofline does, and the simulator is deterministic: the same floats
    from digenrl.sim.scenario import run_mode

    setup = _setup_small()
    for m in ["naive", "gap", "gap_tsp", "gap_tsp_tag", "full", "colocated"]:
        ra = run_mode(setup, m, 3 if m != "colocated" else None)
        rb = run_mode(_as_profiled(setup, ra, tmp_path), m, 3 if m != "colocated" else None)
        for k in ("step_time", "gen_idle", "trainer_idle", "stale_fraction", "tag_fragments_per_step"):
            assert getattr(rb.result, k) == pytest.approx(getattr(ra.result, k), rel=1e-12, abs=1e-12), (m, k)
        assert (rb.n_gen, rb.n_train, rb.plan.fragment_size, rb.plan.chunk_generations, rb.plan.chunk_timesteps) \
            == (ra.n_gen, ra.n_train, ra.plan.fragment_size, ra.plan.chunk_generations, ra.plan.chunk_timesteps)
    # colocated on the 3+5 split's costs (its all-reduce scaled from 5 ranks to 8) is another figure
    naive = run_mode(setup, "naive", 3)
    coloc = run_mode(setup, "colocated")
    assert run_mode(_as_profiled(setup, naive, tmp_path), "colocated").result.step_time != \
        pytest.approx(coloc.result.step_time, rel=1e-3)


def test_a_bad_profile_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "digenrl-profile", "version": 1, "ops": {"denoise": [[1, 0.1]]}}))
    assert main(SMALL + ["--profile", str(bad)]) == 2
    assert "missing" in capsys.readouterr().err


def test_tag_policy_flags(capsys):
    """--tag-policy none runs the TAG mode without TAG (= gap_tsp at the same split); greedy inserts some; bad
    values exit with code 2."""
    none = {r["mode"]: r for r in run_json(capsys, "--gen-gpus", "3", "--modes", "gap_tsp", "gap_tsp_tag",
                                            "--tag-policy", "none")}
    assert none["gap_tsp_tag"]["tag_fragments_per_step"] == 0
    assert none["gap_tsp_tag"]["step_time_s"] == none["gap_tsp"]["step_time_s"]
    (greedy,) = run_json(capsys, "--gen-gpus", "3", "--modes", "gap_tsp_tag", "--tag-policy", "greedy")
    assert greedy["tag_fragments_per_step"] > 0
    for bad in (["--tag-policy", "always"], ["--bts-depth", "-1"], ["--bts-budget-nodes", "0"]):
        assert main(SMALL + bad) == 2
        assert bad[0] in capsys.readouterr().err


def test_workload_flags_reach_the_plan(capsys):
    """--timestep-fraction trains fewer timesteps and --lora-rank trains LoRA (and prices the baselines so), each
    against the same run without the flag; --bts-depth / --bts-budget-nodes become the BTS config the scheduler
    is given."""
    from digenrl.sim.cli import bts_of, build_parser

    def naive(*extra):
        (row,) = run_json(capsys, "--gen-gpus", "3", "--modes", "naive", *extra)
        return row

    full = naive()
    assert naive("--timestep-fraction", "0.5")["step_time_s"] < full["step_time_s"]
    lora = naive("--lora-rank", "64")
    assert lora["step_time_s"] < full["step_time_s"]
    assert lora["baselines"]["idealised"]["training"].startswith("LoRA r64")
    assert full["baselines"]["idealised"]["training"].startswith("full fine-tuning")
    assert bts_of(build_parser().parse_args(SMALL + ["--bts-depth", "0"])).depth == 0
    assert bts_of(build_parser().parse_args(SMALL + ["--bts-budget-nodes", "7"])).budget_nodes == 7


def test_the_table_names_the_runtime_settings_of_each_plan():
    """The ``plan`` column says which runtime keys the chosen plan needs beyond the split."""
    from digenrl.sim.cli import plan_words

    row = {"fragment_size": 4, "chunk": [16, 6], "publish": "stream", "shard_groups": 2, "tag_copy": True,
           "stale_hold": 0.5}
    assert plan_words(row) == "frag 4, chunk 16x6, stream, k=2, tag copy, hold 0.5"
    assert plan_words({"fragment_size": 8, "chunk": None, "publish": "", "shard_groups": 1, "tag_copy": False,
                       "stale_hold": 0.0}) == "frag 8"


def test_a_heterogeneous_testbed_puts_each_pool_on_one_kind():
    """Testbed A+C (32 L40S + 16 H20): every split of n GPUs puts the generators on one kind and the trainers on
    the other, within each kind's count (both ways round); colocation runs on either kind alone or on all of
    them in lock-step at the weaker kind's pace, field by field."""
    from digenrl.sim.cli import _setup, build_parser
    from digenrl.sim.presets import H20, L40S
    from digenrl.sim.scenario import colocated_options, split_options

    def setup(gpus):
        return _setup(build_parser().parse_args(["--model", "flux", "--testbed", "A+C", "--gpus", str(gpus)]))

    def splits(gpus):
        return sorted((s.gen_gpu.name, s.n_gen, s.train_gpu.name, s.n_train) for s in split_options(setup(gpus)))

    l, h = L40S.name, H20.name
    assert splits(48) == sorted([(l, 32, h, 16), (h, 16, l, 32)])  # all 48: each kind whole, both ways round
    # 40: L40S generators 24..32 (the other 8..16 on the 16 H20), or H20 generators 8..16 (32..24 on the L40S)
    assert splits(40) == sorted([(l, g, h, 40 - g) for g in range(24, 33)] + [(h, g, l, 40 - g) for g in range(8, 17)])
    coloc = colocated_options(setup(40))
    assert [(s.train_gpu.name, s.n_train) for s in coloc[:2]] == [(l, 32), (h, 16)]
    weak = coloc[2].train_gpu
    assert coloc[2].n_train == 40 and weak.name == f"min({l},{h})"
    for field in ("bf16_tflops", "hbm_gbs", "memory_gb", "pcie_gbs", "nvlink_gbs"):
        assert getattr(weak, field) == min(getattr(L40S, field), getattr(H20, field)), field


def test_simulate_on_a_heterogeneous_testbed(capsys):
    assert main(["--model", "flux", "--testbed", "A+C", "--gpus", "24", "--steps", "1", "--prompts", "4",
                 "--generations", "8", "--sampling-steps", "10", "--json", "--modes", "colocated", "gap_tsp"]) == 0
    rows = {r["mode"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["gap_tsp"]["gen_gpus"] + rows["gap_tsp"]["trainer_gpus"] == 24
    assert rows["gap_tsp"]["note"] in ("gen L40S-48GB, trn H20-96GB", "gen H20-96GB, trn L40S-48GB")
    assert rows["colocated"]["note"].startswith("colocated on ")
