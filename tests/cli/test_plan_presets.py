"""The shipped presets carry the plan of ``digenrl plan`` on their target testbed (scripts/plan_presets.py).

Planning all five presets takes minutes of CPU, so the suite does not run ``--check`` on them. It checks that
each preset's plan block parses and agrees with the values the preset runs with (the default is the faster of
the plan and colocated), and that the script writes exactly what the planner returns, on a small copy of a
preset planned on 3 GPUs (seconds)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from script_loader import ROOT, load_script

from digenrl.config import load_config

PRESETS = sorted((ROOT / "configs").glob("*.yaml"))
LABEL = re.compile(r"(?:(?P<g>\d+)\+(?P<t>\d+)|(?P<c>\d+) coloc), (?:fragment (?P<f>\d+)|packed (?P<n>\d+) per worker), "
                   r"chunk (?P<cg>\d+)x(?P<ct>\d+)(?:, stale cap (?P<s>[\d.]+))?(?:, (?P<k>\d+) shard groups?)?"
                   r"(?:, publish (?P<pub>\w+))?"
                   r"(?:, stale hold (?P<h>[\d.]+))?(?P<copy>, TAG inference copy)?"
                   r": predicted (?P<time>[\d.e+]+) s/step$")


def _block(text: str) -> dict:
    mod = load_script("scripts/plan_presets.py")
    lines = text.splitlines()
    assert lines.count(mod.BEGIN) == 1 and lines.count(mod.END) == 1
    body = lines[lines.index(mod.BEGIN) + 1:lines.index(mod.END)]
    assert lines[lines.index(mod.END) + 1] == "runtime:"  # the block sits just above the section it sets
    target = mod.INPUT.match(body[0])
    assert target, body[0]
    out = {"testbed": target["testbed"], "gpus": int(target["gpus"]), "mode": target["mode"]}
    for line in body[1:]:
        if line.startswith(f"# {out['mode']}: "):
            out["plan"] = LABEL.search(line).groupdict()
        elif line.startswith("# colocated on the same"):
            m = LABEL.search(line)
            out["colocated"] = m.groupdict() if m else None
        elif line.startswith("# default: "):
            out["default"] = line[len("# default: "):].split(",")[0].split(" ")[0]
    return out


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_preset_runs_the_plan_its_block_records(path):
    b = _block(path.read_text())
    cfg = load_config(str(path))
    plan, co = b["plan"], b["colocated"]
    coloc_faster = co is not None and float(co["time"]) < float(plan["time"])
    assert b["default"] == ("colocated" if coloc_faster else b["mode"])
    assert cfg.runtime.mode == b["default"]
    pick = co if coloc_faster else plan
    if coloc_faster:
        assert (cfg.runtime.generators, cfg.runtime.trainers) == (1, int(co["c"])) and int(co["c"]) == b["gpus"]
    else:
        assert (cfg.runtime.generators, cfg.runtime.trainers) == (int(plan["g"]), int(plan["t"]))
        assert cfg.runtime.generators + cfg.runtime.trainers == b["gpus"]
    if pick["n"] is None:
        assert cfg.runtime.fragment_size == int(pick["f"])
    else:  # a packed colocated plan names what a worker samples in one action (FSDP: priced per rank, the bound)
        from digenrl.control.run_plan import plan_run
        from digenrl.sim.config_source import _unsharded_colocated

        p = plan_run(_unsharded_colocated(cfg)).plan
        assert coloc_faster and p.packed and p.colocated_share * cfg.runtime.fragment_size == int(pick["n"])
    assert (pick["s"] is not None) == (b["mode"] == "full" and pick is plan)  # the stale cap where TCSS uses it
    assert (cfg.train.chunk_generations, cfg.train.chunk_timesteps) == (int(pick["cg"]), int(pick["ct"]))
    assert cfg.train.chunk_cells is None
    if not coloc_faster:  # the searched publish path and stale hold (sim.plan_publish), where the block names them
        assert cfg.runtime.publish == (plan["pub"] or "object_store")
        assert cfg.tuning.stale_hold == float(plan["h"] or 0)
        assert cfg.train.shard_groups == int(plan["k"] or 1)  # the searched shard groups (sim.plan_groups)
        assert cfg.tuning.tag_inference_copy == bool(plan["copy"])  # the searched TAG inference copy


def _small_preset(tmp_path: Path) -> Path:
    """sd35_medium with a small step (2 prompts x 4 generations, 4 sampling steps), to be planned on 3 GPUs."""
    text = (ROOT / "configs" / "sd35_medium.yaml").read_text()
    for key, value in (("prompts_per_step", 2), ("generations", 4), ("num_steps", 4), ("minibatches_per_step", 1)):
        text, n = re.subn(rf"^(  {key}:) *\S+", rf"\g<1> {value}", text, count=1, flags=re.M)
        assert n == 1, key
    text = re.sub(r"^(  micro_batch:) *\S+", r"\g<1> 8", text, count=1, flags=re.M)  # divides P x G = 8
    mod = load_script("scripts/plan_presets.py")
    text = re.sub(rf"^{re.escape(mod.BEGIN)}\n(.*\n)*?{re.escape(mod.END)}\n", "", text, flags=re.M)
    text = text.replace("\nruntime:\n", f"\n{mod.BEGIN}\n# plan: testbed B, 3 GPUs, mode gap_tsp_tag\n{mod.END}\nruntime:\n")
    out = tmp_path / "small.yaml"
    out.write_text(text)
    return out


def test_script_writes_what_the_planner_returns(tmp_path, capsys):
    from digenrl.sim.plan_cli import main as plan_main

    mod = load_script("scripts/plan_presets.py")
    path = _small_preset(tmp_path)
    assert mod.main([str(path)]) == 0
    b = _block(path.read_text())
    assert (b["testbed"], b["gpus"], b["mode"]) == ("B", 3, "gap_tsp_tag")
    capsys.readouterr()
    # the same search by `digenrl plan` itself, from the written file
    assert plan_main(["--config", str(path), "--testbed", "B", "--gpus", "3", "--out", str(tmp_path / "p.yaml"),
                      "--json", *mod._start(mod.Target("B", 3, "gap_tsp_tag"), path)]) == 0
    rep = json.loads(capsys.readouterr().out)
    best, co = rep["best"], rep["colocated"]
    assert float(b["plan"]["time"]) == pytest.approx(best["step_time_s"], rel=1e-3)
    assert (int(b["plan"]["g"]), int(b["plan"]["t"]), int(b["plan"]["f"])) == \
        (best["generators"], best["trainers"], best["fragment_size"])
    assert [int(b["plan"]["cg"]), int(b["plan"]["ct"])] == best["chunk"]
    assert float(b["colocated"]["time"]) == pytest.approx(co["step_time_s"], rel=1e-3)
    assert b["default"] == ("colocated" if co["faster"] else "gap_tsp_tag")
    cfg = load_config(str(path))
    if not co["faster"]:
        assert (cfg.runtime.generators, cfg.runtime.trainers) == (best["generators"], best["trainers"])
        assert cfg.runtime.publish == best["publish"] == (b["plan"]["pub"] or "object_store")
    # --check: up to date now (the search starts from fixed values, not from what it wrote), stale after an edit
    assert mod.main(["--check", str(path)]) == 0
    path.write_text(path.read_text().replace(f"  fragment_size: {cfg.runtime.fragment_size}\n",
                                             f"  fragment_size: {cfg.runtime.fragment_size * 2}\n"))
    assert mod.main(["--check", str(path)]) == 1
    assert "out of date" in capsys.readouterr().err


def test_the_planner_outputs_are_written_under_tuning(tmp_path):
    """A ``full`` plan with a stale hold and a TAG inference copy: the script writes them as ``tuning.stale_hold`` /
    ``tuning.tag_inference_copy`` (adding the section), and drops a preset's old ``runtime.`` spelling of them."""
    mod = load_script("scripts/plan_presets.py")
    text = (ROOT / "configs" / "flux1_dev_mixgrpo.yaml").read_text()
    text = text.replace("\nruntime:\n", "\nruntime:\n  stale_hold: 4\n  tag_inference_copy: false\n", 1)
    assert "\ntuning:" not in text
    p = mod.Planned(mod.Target("B", 6, "full"), "full", 2, 4, 4, (8, 2), 0.25, "broadcast", 0.5, 1, True, "x", 1.0,
                    None, None, "refused", None)
    out = mod.rewrite(text, p)
    path = tmp_path / "p.yaml"
    path.write_text(out)
    cfg = load_config(str(path))
    assert (cfg.tuning.stale_hold, cfg.tuning.tag_inference_copy) == (0.5, True)
    assert (cfg.runtime.mode, cfg.runtime.publish, cfg.runtime.max_stale_fraction) == ("full", "broadcast", 0.25)
    assert not re.search(r"^  (stale_hold|tag_inference_copy):", out.split("\nruntime:\n", 1)[1].split("\n\n")[0],
                         re.M)
    tuning = out.split("\ntuning:\n", 1)[1]
    assert re.search(r"^  stale_hold: 0.5$", tuning, re.M) and re.search(r"^  tag_inference_copy: true$", tuning, re.M)
