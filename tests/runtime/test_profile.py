"""``digenrl profile`` measures the real workers and writes a profile the simulator loads."""

from __future__ import annotations

import json

import pytest

from runtime_helpers import SMALL


def test_profile_command_feeds_the_simulator(ray_local, tiny_model, tmp_path, monkeypatch):
    """(Its workers log beside the profile, not into the config's run_dir: run from a clean directory, the
    default ``runs/demo`` is not created, so a later ``digenrl train`` there is not refused.)"""
    from digenrl.cli import main
    from digenrl.control.run_plan import plan_run
    from digenrl.schedule import OPS
    from digenrl.sim.executor import simulate
    from digenrl.control.profile import load_profile

    out = tmp_path / "profile.json"
    args = ["profile", f"model.path={tiny_model}", *SMALL, "runtime.mode=gap_tsp_tag", "--out", str(out),
            "--repeats", "1"]
    (cwd := tmp_path / "cwd").mkdir()
    monkeypatch.chdir(cwd)
    assert main(args) == 0
    assert not (cwd / "runs").exists() and (tmp_path / "profile.logs" / "gen0.log").is_file()
    data = json.loads(out.read_text())
    assert data["format"] == "digenrl-profile" and data["generators"] == 1 and data["trainers"] == 1
    prof = load_profile(out)
    for op in OPS:
        for pool in ("generator", "trainer"):
            assert prof.time(op, 2, pool) >= 0.0
    assert prof.time("denoise", 4, "generator") > 0 and prof.time("train_chunk", 4, "trainer") > 0
    assert len(data["ops"]["train_chunk"]) == 4  # cells 1, 2, 4, 8 = G x S
    from digenrl.config import load_config

    cfg = load_config(None, [f"model.path={tiny_model}", *SMALL, "runtime.mode=gap_tsp_tag"])
    res = simulate(plan_run(cfg).plan, prof)
    assert res.makespan > 0
    # the same loop from the command line: simulate the config's own plan with the measured profile
    sim_args = ["simulate", "--config", "default", "--profile", str(out), "--json", "--modes", "gap_tsp_tag",
                *[x for kv in [f"model.path={tiny_model}", *SMALL] for x in ("--set", kv)]]
    assert main(sim_args) == 0
    assert main(["profile", "--out", str(tmp_path / "nodir" / "p.json")]) == 2


def test_online_factors_find_a_profile_that_misjudges_the_workers(ray_local, tiny_model, tmp_path):
    """A TAG run given a profile that misjudges the workers by four orders of magnitude (training 1e4 x slower,
    generation on the generators 1e4 x faster than measured): BTS's online factors (observed / profiled seconds,
    each observation kept within [1/clip, clip] x the profile, clip 4) sit exactly at the bounds, 1/4 for
    training and 4 for generation, which they reach only from the run's own observations; the summary and the
    metrics rows carry them. No wall-clock figure is compared: any real timing is far inside the clip."""
    from digenrl.cli import main
    from digenrl.control.profile import Curve, ProfileCost, load_profile, save_profile

    measured = tmp_path / "profile.json"
    common = [f"model.path={tiny_model}", *SMALL, "runtime.mode=gap_tsp_tag"]
    assert main(["profile", *common, "--out", str(measured), "--repeats", "1"]) == 0
    prof = load_profile(measured)
    factor = {"train_chunk": 1e4} | {f"generator/{op}": 1e-4 for op in ("denoise", "vae_decode", "reward", "transfer")}
    curves = dict(prof.curves)
    for key, f in factor.items():
        c = curves.get(key) or curves[key.split("/")[-1]]
        curves[key] = Curve(c.batches, tuple(f * x for x in c.seconds))
    wrong = save_profile(ProfileCost(curves, "misjudged"), tmp_path / "wrong.json")
    run = tmp_path / "run"
    assert main(["train", "--ray", *common, f"runtime.profile={wrong}", f"run_dir={run}"]) == 0
    scales = json.loads((run / "summary.json").read_text())["cost_scales"]
    assert scales["train"] == pytest.approx(0.25, rel=1e-12), scales
    assert scales["generate/generator"] == pytest.approx(4.0, rel=1e-12), scales
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    later = [r for r in rows if r.get("step", 0) >= 2 and "cost_scale/train" in r]
    assert later and all(r["cost_scale/train"] == pytest.approx(0.25, rel=1e-12) for r in later)
