"""`digenrl simulate --config ... --profile ...`: the runtime's own plan, priced with a measured profile."""

import json

import pytest

from digenrl.sim.cli import main

PROFILE = {"format": "digenrl-profile", "version": 1, "source": "test",
           "ops": {"denoise": [[1, 0.004], [8, 0.02]], "vae_decode": [[1, 0.0001]], "reward": [[1, 0.0005]],
                   "transfer": [[1, 0.0001]], "train_chunk": [[1, 0.006], [16, 0.05]], "allreduce": [[1, 0.001]],
                   "optimizer": [[1, 0.003]], "publish": [[1, 0.002]], "tag_switch": [[1, 0.0]]}}
SETS = ["--set", "steps=4", "--set", "runtime.trainers=2"]


def _profile(tmp_path, **scale):
    data = json.loads(json.dumps(PROFILE))
    for op, f in scale.items():
        data["ops"][op] = [[b, s * f] for b, s in data["ops"][op]]
    p = tmp_path / f"profile_{'_'.join(scale) or 'base'}.json"
    p.write_text(json.dumps(data))
    return p


def _rows(capsys, argv):
    assert main(argv) == 0
    return {r["mode"]: r for r in json.loads(capsys.readouterr().out)}


def test_rows_follow_the_runtime_plan(tmp_path, capsys):
    from digenrl.config import load_config
    from digenrl.control.run_plan import plan_run

    rows = _rows(capsys, ["--config", "default", "--profile", str(_profile(tmp_path)), "--json", *SETS])
    assert set(rows) == {"colocated", "naive", "gap", "gap_tsp", "gap_tsp_tag", "full"}
    plan = plan_run(load_config(None, ["steps=4", "runtime.trainers=2", "runtime.mode=gap_tsp"])).plan
    r = rows["gap_tsp"]
    assert (r["gen_gpus"], r["trainer_gpus"], r["fragment_size"]) == (1, 2, plan.fragment_size)
    assert r["chunk"] == [plan.chunk_generations, plan.chunk_timesteps]
    assert rows["colocated"]["trainer_gpus"] == 3 and rows["colocated"]["gen_gpus"] == 0
    assert rows["naive"]["speedup_vs_naive"] == 1.0
    assert rows["gap_tsp"]["step_time_s"] < rows["naive"]["step_time_s"]


def test_costlier_training_lengthens_the_naive_step(tmp_path, capsys):
    base = _rows(capsys, ["--config", "default", "--profile", str(_profile(tmp_path)), "--json", *SETS])
    slow = _rows(capsys, ["--config", "default", "--profile", str(_profile(tmp_path, train_chunk=3.0)), "--json", *SETS])
    assert slow["naive"]["step_time_s"] > base["naive"]["step_time_s"] * 1.2


@pytest.mark.parametrize("argv,needle", [
    (["--config", "default"], "--profile"),
    (["--config", "default", "--profile", "PROFILE", "--set", "train.lrr=1"], "train.lrr"),
    (["--config", "/no/such.yaml", "--profile", "PROFILE"], "such.yaml"),
    (["--config", "default", "--profile", "PROFILE", "--model", "flux"], "--config"),
    (["--config", "default", "--profile", "PROFILE", "--algorithm", "nft"], "--algorithm: with --config"),
    (["--config", "default", "--profile", "PROFILE", "--window", "2"], "--algorithm: with --config"),
    (["--config", "default", "--profile", "PROFILE", "--gpus", "4"], "--gpus: with --profile"),
    ([], "--model"),
])
def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, argv, needle):
    p = str(_profile(tmp_path))
    gantt = tmp_path / "g.png"
    argv = [p if a == "PROFILE" else a for a in argv] + ["--gantt", str(gantt)]
    assert main(argv) == 2
    assert needle in capsys.readouterr().err
    assert not gantt.exists()


def test_trace_and_gantt_of_a_config_run(tmp_path, capsys):
    trace, gantt = tmp_path / "t.json", tmp_path / "g.png"
    assert main(["--config", "default", "--profile", str(_profile(tmp_path)), *SETS, "--modes", "full",
                 "--trace", str(trace), "--gantt", str(gantt)]) == 0
    assert json.loads(trace.read_text()) and gantt.read_bytes()[:4] == b"\x89PNG"


# ---- --config on a named GPU testbed (roofline) ---------------------------------------------------------------

PRESETS = ["configs/flux1_dev.yaml", "configs/wan21_14b.yaml", "configs/qwen_image.yaml",
           "configs/sd35_medium.yaml", "configs/hunyuan_video.yaml", "configs/sd35_medium_nft.yaml",
           "configs/flux1_dev_mixgrpo.yaml", "configs/flux1_dev_mixgrpo_flash.yaml"]


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_prices_on_testbed_b(preset, capsys):
    from digenrl.config import load_config

    rows = _rows(capsys, ["--config", preset, "--testbed", "B", "--steps", "2", "--modes", "gap_tsp_tag", "colocated",
                          "--json"])
    cfg = load_config(preset)
    r, rt = rows["gap_tsp_tag"], cfg.runtime
    workers = rt.trainers if rt.mode == "colocated" else rt.generators + rt.trainers
    if rt.mode == "colocated":  # a preset planned colocated: the disaggregated modes split its workers in half
        assert (r["gen_gpus"], r["trainer_gpus"]) == (workers // 2, workers - workers // 2)
    else:
        assert (r["gen_gpus"], r["trainer_gpus"]) == (rt.generators, rt.trainers)
    assert rows["colocated"]["trainer_gpus"] == workers
    assert r["step_time_s"] > 0 and r["speedup_vs_naive"] >= 1.0 - 1e-9
    # a sharded pool is one shard group the runtime runs (no note); its colocated baseline is the peers' FSDP one
    assert r["note"] == "" and ("fsdp" in rows["colocated"]["note"].lower()) == (cfg.train.sharding == "fsdp")


def test_flux_preset_maps_onto_the_roofline_inputs():
    from digenrl.config import load_config
    from digenrl.sim.from_config import config_model, config_workload

    cfg = load_config("configs/flux1_dev.yaml")
    w = config_workload(cfg, 5)
    # the YAML: 48 x 24 at 512 px, T = 6, int(6 * 0.99) = 5 trained, LoRA r64, no sharding, recomputation
    assert (w.prompts, w.generations, w.width, w.height, w.frames, w.sampling_steps) == (48, 24, 512, 512, 1, 6)
    assert w.trained_timesteps == 5
    assert (w.training.lora_rank, w.training.sharded, w.training.recompute, w.training.publish) == \
        (64, False, True, "object_store")
    m = config_model(cfg)
    assert m.spec.kind == "flux" and m.text_tokens == 128   # model.options.max_sequence_length
    wan = load_config("configs/wan21_14b.yaml")
    ww = config_workload(wan, 19)
    assert (ww.width, ww.height, ww.frames, ww.training.lora_rank) == (416, 240, 33, 32)


def test_gpus_keeps_the_config_ratio(capsys):
    rows = _rows(capsys, ["--config", "configs/flux1_dev.yaml", "--testbed", "B", "--gpus", "16", "--steps", "2",
                          "--modes", "gap", "colocated", "--json", "--set", "runtime.generators=6",
                          "--set", "runtime.trainers=2"])
    assert (rows["gap"]["gen_gpus"], rows["gap"]["trainer_gpus"]) == (12, 4)   # 6 : 2 of the config
    assert rows["colocated"]["trainer_gpus"] == 16


@pytest.mark.parametrize("argv,needle", [
    (["--config", "configs/qwen_image.yaml", "--testbed", "A"], "GiB per trainer rank"),  # 48 GB L40S
    # the preset keeps no EMA (DanceGRPO's recipe) and fits A with one cell per rank; an EMA copy does not fit
    (["--config", "configs/hunyuan_video.yaml", "--testbed", "A", "--set", "train.ema_decay=0.9"],
     "GiB per trainer rank"),
    (["--config", "configs/flux1_dev.yaml", "--testbed", "B", "--gpus", "40"], "--gpus"),
    (["--config", "configs/flux1_dev.yaml", "--testbed", "Z"], "--testbed"),
    (["--config", "configs/flux1_dev.yaml", "--testbed", "B", "--profile", "PROFILE"], "--profile"),
    (["--config", "default", "--testbed", "B"], "model.kind"),
])
def test_testbed_refusals_exit_2(tmp_path, capsys, argv, needle):
    p = str(_profile(tmp_path))
    argv = [p if a == "PROFILE" else a for a in argv] + ["--steps", "2"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err
    if "GiB" in needle:
        assert "testbed A" in err and "train.memory_gb=48" in err


def test_a_colocated_config_is_split_in_half_for_the_disaggregated_modes(capsys):
    rows = _rows(capsys, ["--config", "configs/sd35_medium.yaml", "--testbed", "B", "--steps", "2", "--modes", "gap",
                          "colocated", "--json", "--set", "runtime.mode=colocated", "--set", "runtime.generators=1",
                          "--set", "runtime.trainers=8", "--gpus", "7"])
    assert (rows["gap"]["gen_gpus"], rows["gap"]["trainer_gpus"]) == (3, 4)
    assert rows["colocated"]["trainer_gpus"] == 7


def test_config_path_decides_tag_with_the_configs_policy(tmp_path, capsys):
    """--config simulates with the config's runtime.tag_policy (as the runtime does); --tag-policy overrides it."""
    slow_gen = _profile(tmp_path, denoise=20.0)  # generators are the bottleneck: trainer ranks idle -> TAG pays
    argv = ["--config", "default", "--profile", str(slow_gen), "--json", *SETS, "--modes", "gap_tsp", "gap_tsp_tag"]
    greedy = _rows(capsys, argv + ["--set", "runtime.tag_policy=greedy"])
    assert greedy["gap_tsp_tag"]["tag_fragments_per_step"] > 0
    none = _rows(capsys, argv + ["--set", "runtime.tag_policy=greedy", "--tag-policy", "none"])
    assert none["gap_tsp_tag"]["tag_fragments_per_step"] == 0
    assert none["gap_tsp_tag"]["step_time_s"] == pytest.approx(none["gap_tsp"]["step_time_s"])


def test_profile_pool_sizes_are_checked(tmp_path, capsys):
    """The one policy (``control.profile.profile_at``): a profile measured at 2 trainer ranks prices any count (its
    all-reduce scaled as a ring's); one measured at 1 rank prices only 1: a requested mode at 2 ranks is refused,
    a baseline at another count is priced as profiled and its row says so."""
    p = _profile(tmp_path)
    data = json.loads(p.read_text())
    data["trainers"] = 2
    p.write_text(json.dumps(data))
    rows = _rows(capsys, ["--config", "default", "--profile", str(p), "--json", *SETS, "--modes", "gap_tsp", "colocated"])
    assert rows["gap_tsp"]["note"] == "" and rows["colocated"]["note"] == ""
    three = ["--config", "default", "--profile", str(p), "--json", "--set", "steps=4", "--set", "runtime.trainers=3",
             "--modes", "gap_tsp"]
    assert main(three) == 0
    capsys.readouterr()
    data["trainers"] = 1
    p.write_text(json.dumps(data))
    argv = ["--config", "default", "--profile", str(p), "--json", "--set", "steps=4", "--set", "runtime.trainers=1",
            "--modes", "gap_tsp"]
    assert _rows(capsys, argv)["gap_tsp"]["note"] == ""  # (the colocated baseline at 2: priced as profiled)
    assert main(argv + ["colocated"]) == 2  # requested at 2 ranks: refused
    assert "measured at 1 trainer rank" in capsys.readouterr().err
    assert main(three) == 2
    assert "measured at 1 trainer rank" in capsys.readouterr().err


def test_a_memory_refusal_under_a_profile_without_pool_sizes_exits_2(tmp_path, capsys):
    """A profile without ``trainers`` prices a mode as profiled; when the mode is refused for another reason (here
    its memory plan: FLUX.1-dev in shard groups of 2 ranks) the refusal exits 2 naming it (it was a traceback)."""
    sets = ["train.prompts_per_step=3", "train.generations=4", "train.minibatches_per_step=1", "train.micro_batch=4",
            "sampler.num_steps=10", "runtime.mode=gap_tsp", "runtime.generators=2", "runtime.trainers=4",
            "train.shard_groups=2"]
    argv = ["--config", "configs/flux1_dev_mixgrpo.yaml", "--profile", str(_profile(tmp_path)), "--modes", "gap_tsp",
            *[a for kv in sets for a in ("--set", kv)]]
    assert main(argv) == 2
    assert "gap_tsp does not fit the profile: memory plan" in capsys.readouterr().err


@pytest.mark.parametrize("generations,fragment", [(6, 4), (4, 8)])
def test_rows_price_the_runtime_fragment_size(tmp_path, capsys, generations, fragment):
    """A ``runtime.fragment_size`` that does not divide G runs as the runtime cuts it (``plan_run``: min(f, G),
    the last fragment of a group smaller), not as fragments of 1 (what ``simulate --config`` priced before)."""
    from digenrl.config import load_config
    from digenrl.control.run_plan import plan_run

    sets = [f"train.generations={generations}", f"runtime.fragment_size={fragment}"]
    rows = _rows(capsys, ["--config", "default", "--profile", str(_profile(tmp_path)), "--json", *SETS,
                          *[a for kv in sets for a in ("--set", kv)]])
    for mode, r in rows.items():
        plan = plan_run(load_config(None, ["steps=4", "runtime.trainers=2", f"runtime.mode={mode}", *sets])).plan
        assert r["fragment_size"] == plan.fragment_size == min(fragment, generations), mode


def test_a_colocated_sequence_parallel_config_is_planned_in_lanes():
    """The config path plans a colocated FSDP config with one worker per rank (the idealised bound), and with
    sequence parallelism one per lane of d ranks: the cost model prices a lane's ops at degree d, so a plan of 16
    per-rank workers at d = 8 counted each sample 8x too fast (HunyuanVideo on 16 H100s: 280.6 s/step against
    1796 s at d = 1; the written preset defaulted to colocated on it)."""
    from dataclasses import replace

    from digenrl.config import load_config
    from digenrl.sim.config_source import ConfigSource
    from digenrl.sim.presets import testbed_preset

    cfg = load_config("configs/hunyuan_video.yaml", ["runtime.mode=colocated", "runtime.generators=1", "runtime.trainers=16"])
    src = ConfigSource(cfg, 16, testbed=testbed_preset("B"))
    start = src.start(src.splits()[0])
    for d in (1, 2, 8):
        _, plan = src.build(replace(start, sequence_parallel=d))
        assert plan.sequence_parallel == d and len(plan.trainers) * d == 16 and not plan.generators
