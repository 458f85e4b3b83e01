"""Monitoring a user expects (issue 24, item 3): sample grids and per-reward curves in TensorBoard and wandb,
an autoscaled reward figure (negative rewards visible), a warning and a metric when every reward of a step ties
(nothing trains), and one readable line per step in the terminal (stdout; stderr keeps errors and warnings)."""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch

from digenrl.cli import main
from digenrl.observe.plots import reward_curve

TINY = ["steps=2", "log.progress=false", "train.prompts_per_step=2", "train.generations=2", "eval.num_prompts=4",
        "eval.grid_prompts=4", "sampler.num_steps=2", "eval.every=0", "runtime.checkpoint_every=0"]


def build_constant(value: float = 0.0):
    """A reward that gives every sample the same score (Flow-GRPO's OCR reward at the start: all 0)."""
    def constant(images, prompts):
        return torch.full((len(prompts),), float(value))
    return constant


def test_reward_curve_autoscales_and_draws_each_reward(tmp_path):
    rows = [{"step": 0, "eval_reward": -2.5}] + [
        {"step": k, "reward_mean": -3.0 + 0.1 * k, "reward/jpeg": -4.0 + 0.1 * k, "reward/aesthetic": 5.5 + 0.01 * k}
        for k in range(1, 11)]
    info = reward_curve(rows, tmp_path / "c.png")
    lo, hi = info["ylim"]
    assert lo < -4.0 + 0.1 and hi > 5.5  # every curve inside the axes, negative ones included
    assert (tmp_path / "c.png").stat().st_size > 0
    assert {"reward/jpeg", "reward/aesthetic"} <= set(info["labels"])
    flat = reward_curve([{"step": k, "reward_mean": 0.5} for k in range(1, 4)], tmp_path / "d.png")["ylim"]
    assert flat[0] < 0.5 < flat[1]  # a constant curve still gets a visible range


def test_tensorboard_gets_sample_grids_and_per_reward_curves(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", *TINY, "log.tensorboard=true"]) == 0
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    tags = acc.Tags()
    assert {"samples/before", "samples/after"} <= set(tags["images"])
    img = acc.Images("samples/after")[0]
    assert img.step == 2 and img.width > 50 and img.height > 50
    assert "reward/digits" in tags["scalars"] and len(acc.Scalars("reward/digits")) == 2


def test_wandb_gets_images_when_installed(tmp_path, monkeypatch):
    calls = {"log": [], "init": []}
    fake = types.ModuleType("wandb")

    class Run:
        def log(self, data, step=None):
            calls["log"].append((step, data))

        def finish(self):
            calls["finished"] = True

    fake.init = lambda **kw: calls["init"].append(kw) or Run()
    fake.Image = lambda data, caption=None: ("image", getattr(data, "shape", None), caption)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", *TINY, "log.wandb=true", "log.wandb_project=p"]) == 0
    assert calls["init"][0]["project"] == "p" and calls.get("finished")
    images = [(s, d) for s, d in calls["log"] if any(k.startswith("samples/") for k in d)]
    assert [s for s, _ in images] == [0, 2]
    kind, shape, _ = images[1][1]["samples/after"]
    assert kind == "image" and shape[2] == 3
    assert any("reward/digits" in d for _, d in calls["log"])


def test_tied_rewards_warn_and_are_counted(tmp_path, capsys):
    run = tmp_path / "run"
    reward = "reward={flat: {factory: 'test_monitoring:build_constant', value: 0.0}}"
    assert main(["train", f"run_dir={run}", *TINY, reward]) == 0
    err = capsys.readouterr().err
    assert "warning: step 1: every reward of the step ties (0.000)" in err and "nothing trains" in err
    assert err.count("every reward of the step ties") == 1  # once per run of tied steps, not every step
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "reward_mean" in r]
    assert [r["no_signal"] for r in trained] == [1.0, 1.0] and all(r["zero_std_ratio"] == 1.0 for r in trained)


def test_a_readable_line_per_step(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", *TINY]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("step ")]
    assert len(lines) == 2, lines
    assert lines[0].startswith("step 1/2 | reward ") and "digits " in lines[0] and "samples/s" in lines[0]
    run2 = tmp_path / "quiet"
    assert main(["train", f"run_dir={run2}", *TINY, "log.print_every=0"]) == 0
    assert not [x for x in capsys.readouterr().out.splitlines() if x.startswith("step ")]


MID = [*[a for a in TINY if not a.startswith(("steps=", "eval.every="))], "steps=3", "eval.every=1"]


def _tb_images(run) -> dict[str, list[int]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    return {t: [e.step for e in acc.Images(t)] for t in acc.Tags()["images"]}


def test_tensorboard_gets_a_sample_grid_at_every_eval(tmp_path):
    """eval.every: each mid-run eval's grid goes to TensorBoard (samples/eval at its step), not only the
    before / after grids; nothing more is written to run_dir."""
    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", *MID, "log.tensorboard=true"]) == 0
    assert _tb_images(run) == {"samples/before": [0], "samples/eval": [1, 2], "samples/after": [3]}
    assert not list(run.glob("*grid*")) and sorted(p.name for p in run.glob("samples_*.png")) == [
        "samples_after.png", "samples_before.png"]


def _wandb_records(path):
    """The records of a wandb transaction log (``run-<id>.wandb``: LevelDB log blocks of protobuf Records)."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, buf, block = 7, b"", 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if n == 0 and kind == 0:
            pos += left
            continue
        buf += data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):  # FULL, LAST
            rec = pb.Record()
            rec.ParseFromString(buf)
            buf = b""
            yield rec


def test_wandb_offline_run_gets_the_scalars_and_the_same_images_as_tensorboard(tmp_path, monkeypatch):
    """The real wandb (offline: no network, no account): its run directory under run_dir/wandb receives every
    step's scalars and the sample grids (before, each eval, after), the same images at the same steps as
    TensorBoard."""
    pytest.importorskip("wandb")
    for k, v in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONFIG_DIR": tmp_path / "wb_config",
                 "WANDB_CACHE_DIR": tmp_path / "wb_cache", "WANDB_DATA_DIR": tmp_path / "wb_data"}.items():
        monkeypatch.setenv(k, str(v))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    def logged(run):
        assert main(["train", f"run_dir={run}", *MID, "log.wandb=true", "log.tensorboard=true"]) == 0
        (log,) = run.glob("wandb/offline-run-*/run-*.wandb")
        history = []
        for rec in _wandb_records(log):
            if rec.WhichOneof("record_type") == "history":
                history.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                                for i in rec.history.item})
        return log, history, [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]

    run = tmp_path / "run"
    log, history, rows = logged(run)
    if {r["step"] for r in rows} - {h["_step"] for h in history}:
        # wandb itself now and then loses a history record (seen in about 1 of 16 runs of this test, always step 0;
        # wandb/wandb#10886 reports random history loss): run once more; a loss of ours repeats, and fails below
        run = tmp_path / "run2"
        log, history, rows = logged(run)
    steps = {h["_step"]: h for h in history}
    for r in rows:  # every numeric value of every row, at its step
        for k, v in r.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
                assert steps[r["step"]][k] == pytest.approx(v), (r["step"], k)
    images = {}
    for h in history:
        for k, v in h.items():
            if k.endswith("/_type") and v == "image-file":
                tag = k[: -len("/_type")]
                images.setdefault(tag, []).append(h["_step"])
                png = log.parent / "files" / h[f"{tag}/path"]
                assert png.read_bytes()[:4] == b"\x89PNG" and h[f"{tag}/width"] > 50
    assert images == _tb_images(run) == {"samples/before": [0], "samples/eval": [1, 2], "samples/after": [3]}


def test_tensorboard_gets_the_eval_grids_in_a_ray_run(tmp_path):
    """The Ray runtime's mid-run evals (trainer rank 0, between steps) send their grids too."""
    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", *MID, "log.tensorboard=true", "runtime.mode=gap", "runtime.generators=1",
                 "runtime.trainers=1"]) == 0
    assert _tb_images(run) == {"samples/before": [0], "samples/eval": [1, 2], "samples/after": [3]}
