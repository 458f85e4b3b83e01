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
