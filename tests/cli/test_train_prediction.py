"""`digenrl train` with a measured cost profile (runtime.profile) says, before anything starts, the predicted
step time of its plan against colocated on the same workers, and warns when colocated is predicted faster
(issue 24, item 1; digenrl.sim.prediction)."""

from __future__ import annotations

import json

import pytest

from digenrl.cli import main
from digenrl.config import load_config
from digenrl.sim.prediction import predict, report
from digenrl.control.profile import RingAllreduce
from digenrl.control.profile import load_profile
from digenrl.control.run_plan import plan_run
from digenrl.sim.executor import simulate

OPS = {"denoise": [[1, 0.004], [4, 0.010]], "vae_decode": [[1, 0.001]], "reward": [[1, 0.0005]],
       "transfer": [[1, 0.0001]], "train_chunk": [[1, 0.006], [8, 0.03]], "allreduce": [[1, 0.004]],
       "optimizer": [[1, 0.003]], "publish": [[1, 0.002]], "tag_switch": [[1, 0.0]]}
TINY = ["steps=6", "train.prompts_per_step=3", "train.generations=4", "sampler.num_steps=4",
        "train.timestep_fraction=0.5", "runtime.mode=gap_tsp", "runtime.generators=2", "runtime.trainers=1"]


def _profile(tmp_path, trainers=2, **ops):
    p = tmp_path / f"profile_{len(list(tmp_path.glob('profile_*')))}.json"
    data = {"format": "digenrl-profile", "version": 1, "ops": {**OPS, **ops}}
    if trainers is not None:
        data["trainers"] = trainers
    p.write_text(json.dumps(data))
    return p


def _steady(cfg, cost) -> float:
    from dataclasses import replace

    return simulate(replace(plan_run(cfg).plan, steps=4), cost, record=False).timing()["steady_step_time_s"]


def test_prediction_is_the_simulated_step_of_the_plan_and_of_colocated(tmp_path):
    prof = _profile(tmp_path)
    cfg = load_config(None, TINY + [f"runtime.profile={prof}"])
    pred = predict(cfg)
    cost = load_profile(prof)
    # the plan: 1 trainer rank (no all-reduce); colocated: 3 ranks, the all-reduce measured at 2 scaled as a ring
    assert pred["plan_s"] == pytest.approx(_steady(cfg, RingAllreduce(cost, 2, 1)), rel=1e-12)
    coloc = load_config(None, TINY + [f"runtime.profile={prof}", "runtime.mode=colocated", "runtime.trainers=3",
                                      "runtime.generators=1"])
    assert pred["colocated_s"] == pytest.approx(_steady(coloc, RingAllreduce(cost, 2, 3)), rel=1e-12)
    assert RingAllreduce(cost, 2, 3).time("allreduce", 1, "trainer") == pytest.approx(0.004 * (2 / 3) / (1 / 2))
    assert pred["faster"] == (pred["colocated_s"] < pred["plan_s"])
    assert predict(load_config(None, TINY)) is None  # no profile: nothing to say
    assert predict(coloc) is None


def test_warning_only_when_colocated_is_predicted_faster(tmp_path):
    cheap = load_config(None, TINY + [f"runtime.profile={_profile(tmp_path)}"])
    dear = load_config(None, TINY + [f"runtime.profile={_profile(tmp_path, allreduce=[[1, 5.0]])}"])
    p_cheap, p_dear = predict(cheap), predict(dear)
    assert p_cheap["faster"] and not p_dear["faster"]  # a costly all-reduce: colocated on 3 ranks pays it
    line, warn = report(cheap, p_cheap)
    assert "gap_tsp 2+1" in line and "colocated on the same 3 workers" in line and "x colocated" in line
    assert "predicted faster" in warn and "runtime.mode=colocated" in warn and "runtime.trainers=3" in warn
    line, warn = report(dear, p_dear)
    assert "colocated on the same 3 workers" in line and warn is None


def test_a_profile_that_cannot_price_colocated_says_so(tmp_path):
    cfg = load_config(None, TINY + [f"runtime.profile={_profile(tmp_path, trainers=1)}"])
    line, warn = report(cfg, predict(cfg))
    assert "not priced" in line and "1 trainer rank" in line and warn is None
    # the plan itself at 2 trainer ranks, from a profile measured at 1 (no all-reduce in it): not priced either
    two = load_config(None, TINY + [f"runtime.profile={_profile(tmp_path, trainers=1)}", "runtime.trainers=2"])
    line, warn = report(two, predict(two))
    assert line.endswith("not priced at 2 trainer ranks (the profile was measured at 1 trainer rank (no "
                         "all-reduce): its all-reduce at 2 trainer ranks is unknown)") and warn is None


def test_train_prints_it_before_anything_starts(tmp_path, capsys):
    """Wired into `digenrl train`: here the run is then refused (its run_dir holds a run), exit 2."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    prof = _profile(tmp_path)
    assert main(["train", f"run_dir={run}", *TINY, f"runtime.profile={prof}"]) == 2
    cap = capsys.readouterr()
    assert "digenrl: predicted with runtime.profile" in cap.out and "x colocated" in cap.out
    assert "colocated on the same 3 workers is predicted faster" in cap.err
    assert "already holds a run" in cap.err and sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]
