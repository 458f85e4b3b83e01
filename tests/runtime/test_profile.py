"""``digenrl profile`` measures the real workers and writes a profile the simulator loads."""

from __future__ import annotations

import json

from runtime_helpers import SMALL


def test_profile_command_feeds_the_simulator(ray_local, tiny_model, tmp_path):
    from digenrl.cli import main
    from digenrl.control.run_plan import plan_run
    from digenrl.schedule import OPS
    from digenrl.sim.executor import simulate
    from digenrl.control.profile import load_profile

    out = tmp_path / "profile.json"
    args = ["profile", f"model.path={tiny_model}", *SMALL, "runtime.mode=gap_tsp_tag", "--out", str(out),
            "--repeats", "1"]
    assert main(args) == 0
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
