"""benchmarks/gpu_calibrate.py --tiny on CPU: a complete profile that the simulator reads, whose numbers are the raw
measurements transformed by the documented rule, and the rule's premise (work affine in the block count)."""

import json
from pathlib import Path

import pytest
import torch

from digenrl.control.profile import load_profile
from digenrl.schedule.cost import OPS

from script_loader import load_script

ROOT = Path(__file__).parents[2]


def _module():
    return load_script("benchmarks/gpu_calibrate.py")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("calib")
    raw, prof = d / "raw.json", d / "profile.json"
    assert _module().main(["--tiny", "--repeats", "1", "--out", str(raw), "--profile", str(prof)]) == 0
    return json.loads(raw.read_text()), prof


def _two_point(per_layer: dict, target: int) -> list:
    """The rule written out for two layer counts: t(L*) = t1 + (t2 - t1) (L* - L1) / (L2 - L1), at >= 0."""
    (l1, p1), (l2, p2) = sorted(((int(k), dict(map(tuple, v))) for k, v in per_layer.items()))
    return [[b, max(0.0, p1[b] + (p2[b] - p1[b]) * (target - l1) / (l2 - l1))] for b in sorted(p1)]


def _same(points, expected):
    assert [b for b, _ in points] == [b for b, _ in expected]
    assert [s for _, s in points] == pytest.approx([s for _, s in expected], rel=1e-12, abs=0.0)


def test_profile_is_complete_and_runs_in_the_simulator(tiny, capsys):
    """Structure, not timing: which ops the profile has, at which batch sizes, finite and non-negative (the
    rule clamps an extrapolation at 0). Whether more work takes longer is a wall-clock question that a loaded
    CI machine answers at random for a 64-wide model; the rule itself is checked on FLOPs below."""
    import math

    raw, prof = tiny
    data = json.loads(prof.read_text())
    assert set(data["ops"]) == (set(OPS) - {"denoise"}) | {"generator/denoise", "trainer/denoise"}
    assert (data["generators"], data["trainers"]) == (1, 1)
    cost = load_profile(prof)
    for op, pool in (("denoise", "generator"), ("denoise", "trainer"), ("vae_decode", "generator"),
                     ("train_chunk", "trainer")):
        for b in (1, 4):
            t = cost.time(op, b, pool)
            assert math.isfinite(t) and t >= 0.0, (op, pool, b, t)
    assert [p[0] for p in data["ops"]["generator/denoise"]] == sorted(p[0] for p in data["ops"]["generator/denoise"])
    for op in ("optimizer", "publish"):
        assert cost.time(op, 1, "trainer") >= 0
    assert "tiny" in data["source"] and "t = a + b*L" in data["source"]

    from digenrl.sim.cli import main as simulate

    argv = ["--config", str(ROOT / "configs" / "flux1_dev.yaml"), "--profile", str(prof), "--json", "--modes",
            "naive", "gap_tsp", "--set", "steps=2", "--set", "runtime.generators=1", "--set", "runtime.trainers=1"]
    assert simulate(argv) == 0
    rows = {r["mode"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["naive"]["step_time_s"] > 0 and rows["gap_tsp"]["step_time_s"] > 0


def test_profile_numbers_are_the_raw_measurements_under_the_stated_rule(tiny):
    raw, prof = tiny
    mod = _module()
    target = raw["meta"]["target_units"]
    assert raw["meta"]["layers"] == [1, 2] and target == 4 and raw["complete"]
    data = json.loads(prof.read_text())
    per_l = raw["variants"]["lora"]["layers"]  # flux1_dev.yaml: LoRA, recomputation on
    _same(data["ops"]["generator/denoise"], _two_point({L: m["denoise"] for L, m in per_l.items()}, target))
    _same(data["ops"]["trainer/denoise"], _two_point({L: m["denoise_trainer"] for L, m in per_l.items()}, target))
    _same(data["ops"]["train_chunk"], _two_point({L: m["train_chunk"]["recompute"] for L, m in per_l.items()}, target))
    for op in ("optimizer", "publish"):
        _same(data["ops"][op], _two_point({L: m[op] for L, m in per_l.items()}, target))
    for op in ("vae_decode", "transfer"):  # independent of the block count: as measured
        assert data["ops"][op] == raw["unscaled"][op]
    for op in ("reward", "allreduce", "tag_switch"):
        assert data["ops"][op] == [[1, 0.0]]
    # the other variants come from the same raw results
    full = mod.profile_from(raw, lora=False, recompute=False)["ops"]
    per_f = raw["variants"]["full"]["layers"]
    _same(full["train_chunk"], _two_point({L: m["train_chunk"]["no_recompute"] for L, m in per_f.items()}, target))
    _same(full["publish"], _two_point({L: m["publish"] for L, m in per_f.items()}, target))
    # what the runtime publishes: LoRA adapters only vs every transformer weight (fp32 here)
    f1, l1 = per_f["1"], per_l["1"]
    assert f1["trainable_params"] == f1["transformer_params"] and f1["publish_bytes"] == 4 * f1["trainable_params"]
    assert 0 < l1["trainable_params"] < f1["trainable_params"]
    from flux_random import flux_transformer  # sizes at the target = those of the model built at 4 units

    at4 = raw["variants"]["full"]["at_target"]
    n4 = sum(p.numel() for p in flux_transformer(4, 8, tiny=True, device="meta").parameters())
    assert at4["transformer_params"] == n4 and at4["publish_bytes"] == 4 * n4


def test_least_squares_fit_over_more_layer_counts():
    import numpy as np

    mod = _module()
    L, t = [1, 2, 4, 7], [0.31, 0.52, 0.97, 1.58]
    b, a = np.polyfit(L, t, 1)
    assert mod.fit_affine(L, t) == pytest.approx((a, b))
    assert mod.scale_to(L, t, 19) == pytest.approx(a + 19 * b)
    assert mod.scale_to([1, 2], [1.0, 0.5], 19) == 0.0  # clamped
    with pytest.raises(ValueError, match="--layers"):
        mod.fit_affine([3, 3], [1.0, 1.1])


def test_check_layers_reports_the_rule_error_against_a_direct_measurement():
    mod = _module()

    def at(units, slow=1.0):  # t = (0.1 + 0.2 L) * batch, one op shape per kind
        t = lambda b: [b, (0.1 + 0.2 * units) * b * slow]  # noqa: E731
        return {"denoise": [t(1), t(4)], "denoise_trainer": [t(1)], "optimizer": [t(1)], "publish": [t(1)],
                "train_chunk": {"no_recompute": [t(2)], "recompute": [t(2)]}}

    raw = {"meta": {"check_units": 3}, "variants": {"full": {"layers": {"1": at(1), "2": at(2)}}}}
    err = mod.check_rule(raw, {"full": at(3, slow=1.1)})  # measured 10% slower than the affine prediction
    assert set(err) == {"full/denoise/1", "full/denoise/4", "full/denoise_trainer/1", "full/optimizer/1",
                        "full/train_chunk/no_recompute/2", "full/train_chunk/recompute/2", "full/publish/1"}
    assert all(e == pytest.approx(1 / 1.1 - 1) for e in err.values())


def _train_flops(units: int) -> int:
    """FLOPs of one forward + backward of the tiny FLUX transformer with ``units`` x (1 double + 2 single)."""
    from torch.utils.flop_counter import FlopCounterMode

    from digenrl.models.memory_probe import transformer_inputs

    mod = _module()  # puts benchmarks/ on the path for flux_random
    from flux_random import flux_transformer

    assert mod.FLUX1_UNITS == 19
    torch.manual_seed(0)
    model = flux_transformer(units, 2 * units, tiny=True, in_channels=64)
    x = transformer_inputs("flux", model, 2, 16, 8)
    with FlopCounterMode(display=False) as counter:
        model(**x)[0].square().mean().backward()
    return counter.get_total_flops()


def test_scaling_rule_predicts_a_third_layer_count_exactly_on_flops():
    """The rule's premise: the work is a + b*L in the number of units. Fitted on FLOPs counted at 1 and 2 units,
    it must predict the count at 3 and 5 units exactly (a proportional rule would not)."""
    mod = _module()
    f = {u: _train_flops(u) for u in (1, 2, 3, 5)}
    for target in (3, 5):
        assert mod.scale_to([1, 2], [f[1], f[2]], target) == pytest.approx(f[target], rel=1e-12)
        assert f[1] * target != pytest.approx(f[target], rel=0.01)  # the fixed part is visible at these sizes


def test_scaling_rule_gives_flux1_parameter_count_from_one_and_two_units():
    """Full fine-tuning's optimizer and publish work is proportional to the trainable parameters: at the real
    widths (built on the meta device, nothing allocated) the rule fitted on 1 and 2 units gives the 19-unit
    count exactly, and that is the FLUX.1-dev transformer (19 double + 38 single blocks)."""
    mod = _module()
    from flux_random import flux_transformer

    n = {u: sum(p.numel() for p in flux_transformer(u, 2 * u, device="meta").parameters()) for u in (1, 2, 19)}
    assert mod.scale_to([1, 2], [n[1], n[2]], mod.FLUX1_UNITS) == n[19]
    assert n[19] == 11_901_408_320  # the 11.9B of the FLUX.1-dev transformer (diffusers class, published config)


def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys):
    mod = _module()
    out, prof = tmp_path / "r.json", tmp_path / "p.json"
    assert mod.main(["--tiny", "--out", str(out)]) == 2  # no --profile for a tiny run
    assert "--profile" in capsys.readouterr().err
    for argv, needle in ((["--layers", "2", "2"], "--layers"), (["--cells", "0", "4"], "--cells"),
                         (["--set", "model.kind=sd3"], "model.kind"), (["--set", "train.lrr=1"], "train.lrr"),
                         (["--finetune", "full"], "--finetune")):  # flux1_dev.yaml is LoRA
        assert mod.main(["--tiny", *argv, "--out", str(out), "--profile", str(prof)]) == 2
        assert needle in capsys.readouterr().err
    assert not out.exists() and not prof.exists()
