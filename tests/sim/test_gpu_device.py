"""The bare-device GPU check's CPU dry path at tiny size (benchmarks/gpu_device.py --tiny) and its results as a
profile the simulator reads (sim.device_profile), the scaling rule against a hand formula."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from script_loader import load_script

from digenrl.control.profile import load_profile
from digenrl.sim.device_profile import affine_at, profile_from_device
from digenrl.models.specs import SPECS

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_dry_run_writes_results_and_a_profile(tmp_path):
    pytest.importorskip("diffusers")
    mod = load_script("benchmarks/gpu_device.py")
    rc = mod.main(["--tiny", "--repeats", "1", "--families", "flux", "--out", str(tmp_path),
                   "--stages", "forward,train,lora,vae,host_copy"])
    raw = json.loads((tmp_path / "device.json").read_text())
    assert rc == 0, {k: v.get("error") for k, v in raw["stages"].items()}
    assert all(s["ok"] for s in raw["stages"].values())
    fwd = raw["stages"]["forward"]["result"]["flux"]
    assert [p[0] for p in fwd["1"]] == [1, 2, 4] and [p[0] for p in raw["stages"]["train"]["result"]["flux"]["2"]] == [1, 3, 8]
    prof = load_profile(tmp_path / "profile_device.json")
    assert prof.time("denoise", 2, "generator") > 0 and prof.time("train_chunk", 3, "trainer") > 0
    assert "gpu_device.py" in prof.source
    assert mod.main(["--tiny", "--families", "sdxl", "--out", str(tmp_path)]) == 2


def _raw(fwd: dict, train: dict) -> dict:
    ok = lambda r: {"ok": True, "seconds": 0.0, "result": r}  # noqa: E731
    return {"format": "digenrl-device-results",
            "meta": {"device": "X", "date": "d", "torch": "t", "dtype": "bfloat16", "units": [1, 2]},
            "stages": {"forward": ok({"flux": fwd}), "train": ok({"flux": train}),
                       "vae": ok({"px": 512, "points": [[1, 0.2], [4, 0.7]]}),
                       "host_copy": ok({"bytes": 1, "pinned": {"h2d_gbs": 20.0, "d2h_gbs": 10.0}})}}


def test_the_profile_scales_measured_blocks_to_the_model_by_the_affine_rule():
    # t(L) = a + b L through (1, t1), (2, t2): t(19) = t1 + 18 (t2 - t1)
    raw = _raw({"1": [[1, 0.10], [2, 0.15]], "2": [[1, 0.14], [2, 0.23]]},
               {"1": [[1, 0.3], [3, 0.6], [8, None, "OOM"]], "2": [[1, 0.5], [3, 1.0], [8, 2.0]]})
    ops = profile_from_device(raw)["ops"]
    assert ops["denoise"] == [[1, pytest.approx(0.10 + 18 * 0.04)], [2, pytest.approx(0.15 + 18 * 0.08)]]
    assert ops["train_chunk"] == [[1, pytest.approx(0.3 + 18 * 0.2)], [3, pytest.approx(0.6 + 18 * 0.4)]]  # no 8
    nbytes = 2 * SPECS["flux"].arch.params
    assert ops["publish"] == [[1, pytest.approx(nbytes / 10e9 + nbytes / 20e9)]]
    assert ops["vae_decode"] == [[1, 0.2], [4, 0.7]] and ops["optimizer"] == [[1, 0.0]]
    assert affine_at({1: 1.0, 2: 0.5}, 19) == 1.0  # a falling fit (noise) is held at the slowest measured point
    assert affine_at({2: 1.0, 4: 0.5}, 1) == 1.25  # inside or below the measured counts: the fit itself
    bad = dict(raw, stages=dict(raw["stages"], train={"ok": False, "error": "x"}))
    with pytest.raises(KeyError, match="train"):
        profile_from_device(bad)


def test_the_acceptance_script_parses_and_the_bundle_script_names_no_ray():
    assert subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "gpu_acceptance.sh")]).returncode == 0
    bundle = (ROOT / "scripts" / "device_bundle.sh").read_text()
    assert "diffusers==" in bundle and "pydantic==" in bundle and "ray" not in bundle.split("PKGS=")[1].split(")")[0]
    r = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_acceptance.sh"), "--bogus"], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "unknown argument" in r.stderr
