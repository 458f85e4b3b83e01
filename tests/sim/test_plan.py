"""`digenrl plan`: the sweep, the robustness report, the written config, bad input."""

import json

import pytest

from digenrl.config import load_config
from digenrl.control.run_plan import plan_run
from digenrl.schedule import Mode
from digenrl.sim.executor import simulate, steady_step_time
from digenrl.sim.plan_cli import main

OPS = {"denoise": [[1, 0.004], [4, 0.010]], "vae_decode": [[1, 0.001]], "reward": [[1, 0.0005]],
       "transfer": [[1, 0.0001]], "train_chunk": [[1, 0.006], [8, 0.03]], "allreduce": [[1, 0.004]],
       "optimizer": [[1, 0.003]], "publish": [[1, 0.002]], "tag_switch": [[1, 0.0]]}
# a tiny space: G = 4 (fragments 1, 2, 4), S = 2 (chunks {1,2,4} x {1,2}), 3 workers (splits 1+2, 2+1)
TINY = ["steps=6", "train.prompts_per_step=3", "train.generations=4", "sampler.num_steps=4",
        "train.timestep_fraction=0.5", "runtime.mode=gap_tsp", "runtime.generators=2", "runtime.trainers=1"]


def _profile(tmp_path, trainers=2, name="p.json"):
    data = {"format": "digenrl-profile", "version": 1, "source": "hand-made", "ops": OPS}
    if trainers is not None:
        data["trainers"] = trainers
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


def _sets(extra=()):
    return [a for kv in list(TINY) + list(extra) for a in ("--set", kv)]


def _run(capsys, argv):
    assert main(argv + ["--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


class _NoAllreduce:  # one trainer rank: no collective (the rule the sweep applies, written out here)
    def __init__(self, cost):
        self.cost = cost

    def time(self, op, batch, pool):
        return 0.0 if op == "allreduce" else self.cost.time(op, batch, pool)


def test_sweep_picks_the_fastest_of_an_exhaustive_loop(tmp_path, capsys):
    from digenrl.control.profile import load_profile

    prof = _profile(tmp_path)
    rep = _run(capsys, ["--config", "default", "--profile", str(prof), "--out", str(tmp_path / "plan.yaml"),
                        *_sets(), "--no-prune"])
    pruned = _run(capsys, ["--config", "default", "--profile", str(prof), "--out", str(tmp_path / "plan2.yaml"),
                           *_sets()])
    from digenrl.sim.scenario import rule_chunk

    cost = load_profile(prof)
    times, every_chunk = {}, {}
    for g in (1, 2):
        for f in (1, 2, 4):
            c = cost if 3 - g == 2 else _NoAllreduce(cost)
            base = TINY + [f"runtime.generators={g}", f"runtime.trainers={3 - g}", f"runtime.fragment_size={f}",
                           "steps=4"]
            for cg in (1, 2, 4):
                for cs in (1, 2):
                    cfg = load_config(None, base + [f"train.chunk_generations={cg}", f"train.chunk_timesteps={cs}"])
                    every_chunk[(g, f, cg, cs)] = steady_step_time(plan_run(cfg).plan, c)
            # the planner's one chunk rule (not an axis: sim.planner), at most G x S cells with a profile
            cg, cs = rule_chunk(plan_run(load_config(None, base)).plan, c, 8)
            times[(g, f, cg, cs)] = every_chunk[(g, f, cg, cs)]
    best = min(times.values())
    assert len(set(times.values())) > 3  # the space is not flat: the choice matters
    assert rep["probes"] == len(times)
    assert rep["best"]["step_time_s"] == pytest.approx(best, rel=1e-12)
    b = rep["best"]
    assert times[(b["generators"], b["fragment_size"], *b["chunk"])] == pytest.approx(best, rel=1e-12)
    assert best <= 1.05 * min(every_chunk.values())  # the rule's chunk costs at most 5 % here
    assert pruned["best"] == b and pruned["probes"] < rep["probes"] and pruned["pruned"] > 0  # same plan, fewer runs


def test_written_plan_loads_and_plans_as_priced(tmp_path, capsys):
    out = tmp_path / "plan.yaml"
    rep = _run(capsys, ["--config", "default", "--profile", str(_profile(tmp_path)), "--out", str(out),
                        *_sets(["runtime.mode=full"])])
    b = rep["best"]
    assert b["max_stale_fraction"] in (0.0, 0.25, 0.5)
    cfg = load_config(str(out))
    expect = load_config(None, TINY + ["runtime.mode=full", f"runtime.generators={b['generators']}",
                                       f"runtime.trainers={b['trainers']}",
                                       f"runtime.fragment_size={b['fragment_size']}",
                                       f"train.chunk_generations={b['chunk'][0]}",
                                       f"train.chunk_timesteps={b['chunk'][1]}",
                                       f"runtime.max_stale_fraction={b['max_stale_fraction']}"])
    assert plan_run(cfg).plan == plan_run(expect).plan
    assert plan_run(cfg).plan.steps == 6 and plan_run(cfg).plan.mode is Mode.FULL
    assert cfg.train.prompts_per_step == 3  # the input config (with --set) is kept


def test_robustness_report(tmp_path, capsys):
    rep = _run(capsys, ["--config", "default", "--profile", str(_profile(tmp_path)), "--out",
                        str(tmp_path / "p.yaml"), *_sets(["runtime.mode=gap_tsp_tag"]), "--gpus", "4"])
    t = rep["best"]["step_time_s"]
    r = rep["robustness"]
    # scaling every op cost scales virtual time exactly
    assert r["uniform"]["x0.8"] == pytest.approx(0.8 * t, rel=1e-9)
    assert r["uniform"]["x1.2"] == pytest.approx(1.2 * t, rel=1e-9)
    slow_train = r["skewed"]["rollout x0.8, training x1.2"]
    assert slow_train["best_split_s"] <= slow_train["chosen_s"]
    assert r["neighbours"] and all(v >= t for v in r["neighbours"].values())
    # a profile measured with 2 trainers prices every count (its all-reduce scaled: control.profile.profile_at)
    assert rep["refused"] == {} and set(rep["best_per_split_s"]) == {"1+3", "2+2", "3+1"}


def test_plan_on_a_testbed_writes_a_runnable_preset(tmp_path, capsys):
    out = tmp_path / "sd35.yaml"
    rep = _run(capsys, ["--config", "configs/sd35_medium.yaml", "--testbed", "B", "--gpus", "3", "--out", str(out),
                        "--set", "train.prompts_per_step=2", "--set", "train.generations=4",
                        "--set", "sampler.num_steps=4"])
    cfg = load_config(str(out))
    assert cfg.train.memory_gb == 80 and cfg.train.chunk_cells is None
    assert (cfg.runtime.generators, cfg.runtime.trainers) == (rep["best"]["generators"], rep["best"]["trainers"])
    from digenrl.train.memory_check import check_config
    assert check_config(cfg) is not None  # `digenrl train` accepts its memory plan


def test_the_colocated_baseline_trains_in_its_own_chunk_not_the_configs(tmp_path, capsys):
    """On a testbed the colocated baseline trains in the chunk ``train.chunk_cells: auto`` gives a colocated rank
    on that GPU (as ``scripts/plan_presets.py`` plans it), whatever chunk the config carries. A planned preset
    carries its disaggregated plan's chunk: flux1_dev's 4 x 1 priced colocated at 280 s instead of 256 s on 8 GPUs
    of testbed B, and the report said the plan was 1.33x colocated instead of 1.22x."""
    from digenrl.train.memory_check import resolve_chunk_cells

    small = ["train.prompts_per_step=2", "train.generations=4", "sampler.num_steps=4"]
    base = ["--config", "configs/sd35_medium.yaml", "--testbed", "B", "--gpus", "3"] + [
        a for kv in small for a in ("--set", kv)]
    reps = [_run(capsys, base + ["--out", str(tmp_path / f"{g}x{t}.yaml"), "--set", f"train.chunk_generations={g}",
                                 "--set", f"train.chunk_timesteps={t}"]) for g, t in ((1, 1), (4, 2))]
    assert reps[0]["colocated"] == reps[1]["colocated"]
    co = load_config("configs/sd35_medium.yaml", small + ["runtime.mode=colocated", "runtime.generators=1",
                                                          "runtime.trainers=3", "train.chunk_cells=auto",
                                                          "train.memory_gb=80"])
    co = resolve_chunk_cells(co, plan_run(co).trained_timesteps).train
    assert reps[0]["colocated"]["label"].endswith(f"chunk {co.chunk_generations}x{co.chunk_timesteps}")


@pytest.mark.parametrize("argv,needle", [
    (["--probe-steps", "3"], "--probe-steps"),
    (["--testbed", "B"], "--profile"),           # both --profile and --testbed
    (["--set", "train.lrr=1"], "train.lrr"),
    (["--gpus", "1"], "--gpus"),
    (["--out", "/no/such/dir/plan.yaml"], "--out"),
])
def test_bad_input_exits_2_naming_the_option(tmp_path, capsys, argv, needle):
    out = tmp_path / "plan.yaml"
    base = ["--config", "default", "--profile", str(_profile(tmp_path)), *_sets()]
    if "--out" not in argv:
        base += ["--out", str(out)]
    if "--set" in argv and "runtime.mode=colocated" in argv:
        base += ["--gpus", "3"]
    assert main(base + argv) == 2
    assert needle in capsys.readouterr().err
    assert not out.exists()


def test_a_sequence_parallel_generator_pool_is_planned_on_all_its_gpus(tmp_path, capsys):
    """Without --gpus the plan searches the GPUs the config uses: 2 generators of Ulysses degree 2 and 2 trainer
    ranks are 6 GPUs, not 4 workers."""
    rep = _run(capsys, ["--config", "configs/wan21_14b.yaml", "--testbed", "B", "--out", str(tmp_path / "p.yaml"),
                        "--probe-steps", "4", "--set", "runtime.generator_sequence_parallel.ulysses=2",
                        "--set", "runtime.generators=2", "--set", "runtime.trainers=2"])
    assert rep["workers"] == 6


def test_unknown_testbed_exits_2(tmp_path, capsys):
    out = tmp_path / "plan.yaml"
    assert main(["--config", "configs/flux1_dev.yaml", "--testbed", "Z", "--out", str(out)]) == 2
    assert "--testbed" in capsys.readouterr().err and not out.exists()


def test_coordinate_descent_probes_fewer_and_never_beats_the_exhaustive_best(tmp_path, capsys):
    prof = str(_profile(tmp_path))
    wide = _sets(["train.generations=8", "runtime.mode=full"])  # 4 fragments x 3 stale caps per split
    full = _run(capsys, ["--config", "default", "--profile", prof, "--out", str(tmp_path / "a.yaml"), *wide,
                         "--no-prune"])
    cd = _run(capsys, ["--config", "default", "--profile", prof, "--out", str(tmp_path / "b.yaml"), *wide,
                       "--exhaustive", "1", "--no-prune"])
    assert cd["probes"] < full["probes"]
    assert cd["best"]["step_time_s"] >= full["best"]["step_time_s"] * (1 - 1e-12)
    assert min(cd["best_per_split_s"].values()) == cd["best"]["step_time_s"]


def test_plan_reports_colocated_on_the_same_workers(tmp_path, capsys):
    """The report and the written file carry the colocated baseline planned on the same 3 workers: the best of
    its fragment sizes, each simulated directly here; the warning says when it is the faster one."""
    from digenrl.control.profile import load_profile

    out = tmp_path / "plan.yaml"
    prof = _profile(tmp_path, trainers=3)
    argv = ["--config", "default", "--profile", str(prof), "--out", str(out), *_sets()]
    rep = _run(capsys, argv)
    cost = load_profile(prof)
    times = []
    for f in (1, 2, 4):
        cfg = load_config(None, TINY + ["runtime.mode=colocated", "runtime.generators=1", "runtime.trainers=3",
                                        f"runtime.fragment_size={f}", "steps=4"])
        times.append(simulate(plan_run(cfg).plan, cost, record=False).timing()["steady_step_time_s"])
    co = rep["colocated"]
    assert co["step_time_s"] == pytest.approx(min(times), rel=1e-12)
    assert co["faster"] == (co["step_time_s"] < rep["best"]["step_time_s"])
    head = out.read_text().splitlines()[1]
    assert head.startswith("# colocated on the same workers") and f"{co['step_time_s']:.4g} s" in head
    assert main(argv) == 0  # the text report: a warning on stderr exactly when colocated is faster
    text, err = capsys.readouterr()
    assert ("WARNING: colocated is predicted faster" in err) == co["faster"]
    # ... and it names what the baseline models: every worker samples its share of the P x G = 3 x 4 trajectories
    assert (co["trajectories"], co["fsdp"]) == (12, False)
    assert "colocated on the same 3 workers (each samples its share of the step's 12 trajectories" in text
    # its label says so too (12 / 3 = 4 a worker in one action), not a fragment size; no stale cap outside TCSS
    assert ", packed 4 per worker, " in co["label"] and "fragment" not in co["label"]
    assert rep["mode"] != "full" and "stale cap" not in co["label"] + rep["best"]["label"]


def test_a_large_space_descends_only_on_the_best_splits(tmp_path, capsys):
    """Beyond --exhaustive every split is probed once at the config's values; only --descend-splits of them
    get the coordinate descent (so fewer probes than the exhaustive sweep, every split still priced)."""
    prof = _profile(tmp_path)
    base = ["--config", "default", "--profile", str(prof), *_sets(["train.generations=8", "runtime.mode=full"]),
            "--gpus", "4"]
    full = _run(capsys, base + ["--out", str(tmp_path / "a.yaml")])
    cut = _run(capsys, base + ["--out", str(tmp_path / "b.yaml"), "--exhaustive", "1", "--descend-splits", "1"])
    assert set(cut["best_per_split_s"]) == set(full["best_per_split_s"]) == {"1+3", "2+2", "3+1"}
    assert cut["probes"] < full["probes"]
    assert cut["best"]["step_time_s"] >= full["best"]["step_time_s"] * (1 - 1e-12)  # never better than exhaustive
    assert main(base + ["--out", str(tmp_path / "c.yaml"), "--descend-splits", "0"]) == 2
    assert "--descend-splits" in capsys.readouterr().err


def test_plan_prices_colocated_fsdp_like_simulate_config():
    """A colocated FSDP config (hunyuan_video: train.sharding=fsdp) is planned one worker per rank, priced as the
    idealised colocated FSDP bound, like `digenrl simulate --config`: the plan's colocated step equals the simulator's for
    the same values (before, the whole pool ran as one worker generating each fragment alone: hunyuan_video's
    planned preset priced colocated at 33580 s against simulate's 3487 s)."""
    from digenrl.sim.config_source import ConfigSource, run_config_modes
    from digenrl.sim.planner import search
    from digenrl.sim.presets import testbed_preset

    sets = ["runtime.mode=colocated", "runtime.generators=1", "runtime.trainers=16", "runtime.fragment_size=6",
            "train.chunk_generations=4", "train.chunk_timesteps=1"]
    cfg = load_config("configs/hunyuan_video.yaml", sets)
    src = ConfigSource(cfg, 16, testbed=testbed_preset("A"))
    res = search(src, probe_steps=4, exhaustive=1, descend_splits=1)
    probe = next(p for p in res.probes if p.candidate == src.start(src.splits()[0]))
    assert len(probe.plan.trainers) == 16  # one scheduler worker per rank, not one shard group
    pinned = src.config_for(probe.candidate)  # its chunk shape: the planner's rule
    sim = run_config_modes("configs/hunyuan_video.yaml", sets + ["steps=4", f"train.chunk_generations="
                           f"{pinned.train.chunk_generations}", f"train.chunk_timesteps={pinned.train.chunk_timesteps}"],
                           ["colocated"], testbed=testbed_preset("A"))
    want = sim["colocated"].result.timing()["steady_step_time_s"]
    assert abs(probe.step_time - want) <= 1e-6 * want
