"""Refuse early (issue 24, items 3 and 5): what would fail inside a worker, or after a run directory was made,
is refused before anything starts -- exit 2, one message naming the key, no run_dir on disk -- and a run that
fails is retried only where a retry can help, and told to ``--resume`` only where a checkpoint exists."""

from __future__ import annotations

import json
import sys

import pytest

from digenrl.cli import main

FAST = ["steps=1", "log.progress=false", "train.prompts_per_step=2", "train.generations=2", "eval.num_prompts=2",
        "sampler.num_steps=2"]


def _refused(capsys, tmp_path, args, key):
    run = tmp_path / "run"
    flags = [a for a in args if a.startswith("--")]
    assert main(["train", *flags, f"run_dir={run}", *FAST, *[a for a in args if not a.startswith("--")]]) == 2
    err = capsys.readouterr().err
    assert f"digenrl: error: {key}" in err, err
    assert not run.exists()
    return err


def test_wandb_missing_is_refused_up_front(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` -> ImportError, as where it is not installed
    err = _refused(capsys, tmp_path, ["log.wandb=true"], "log.wandb")
    assert "pip install wandb" in err and "log.wandb=false" in err


def test_cuda_without_cuda_is_refused(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _refused(capsys, tmp_path, ["model.device=cuda"], "model.device")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    err = _refused(capsys, tmp_path, ["model.device=cuda:2"], "model.device")
    assert "2 CUDA device" in err
    _refused(capsys, tmp_path, ["model.device=tpu9"], "model.device")


def test_more_gpus_than_the_machine_has_is_refused_before_ray(tmp_path, capsys, monkeypatch):
    import ray
    import torch

    import digenrl.runtime.cluster as cluster
    import digenrl.runtime.driver as driver

    # the local start's check: as in a fresh process, whatever Ray this test process joined before (the runtime
    # tests' session-wide Ray would be reused, and checked against its own resources instead)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("ray.init before the GPU check"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cluster, "start_pools", lambda *a, **k: pytest.fail("workers started"))
    monkeypatch.setattr(driver._Controller, "start_pools", lambda *a, **k: pytest.fail("workers started"))
    err = _refused(capsys, tmp_path, ["--ray", "runtime.mode=gap", "runtime.generators=2", "runtime.trainers=1",
                                      "runtime.generator_resources={GPU: 1}"], "runtime.generator_resources")
    assert "this machine has 1" in err


@pytest.mark.parametrize("args, key", [
    (["reward={digits: {weight: 1, nope: 3}}"], "reward.digits.nope"),
    (["model.path={tmp}/missing.safetensors"], "model.path"),
    (["model.checkpoint={tmp}/missing.safetensors"], "model.checkpoint"),
])  # fmt: skip
def test_bad_options_and_missing_files_before_any_worker(tmp_path, capsys, monkeypatch, args, key):
    import digenrl.runtime.driver as driver

    monkeypatch.setattr(driver, "run_training", lambda *a, **k: pytest.fail("the Ray driver started"))
    _refused(capsys, tmp_path, ["--ray", "runtime.mode=gap", *[a.replace("{tmp}", str(tmp_path)) for a in args]], key)


def _fake_ray_run(monkeypatch, exc_factory):
    """``run_training`` that creates the run outputs as the driver does, then fails before a step."""
    import digenrl.runtime.driver as driver
    from digenrl.runtime.run_outputs import RunOutputs

    def fake(cfg, start=None, stop=None, ray=None):
        out = RunOutputs(cfg, start)
        try:
            raise exc_factory()
        finally:
            out.close()

    monkeypatch.setattr(driver, "run_training", fake)


def test_run_that_never_started_leaves_no_run_dir(tmp_path, capsys, monkeypatch):
    from digenrl.runtime.errors import WorkerFailure

    _fake_ray_run(monkeypatch, lambda: WorkerFailure("gen0", None, "startup", "RuntimeError: no memory"))
    run = tmp_path / "run"
    assert main(["train", "--ray", f"run_dir={run}", *FAST]) == 1
    err = capsys.readouterr().err
    assert "worker gen0 failed" in err and "--resume" not in err
    assert not run.exists()  # nothing was trained: nothing kept


def test_failure_suggests_resume_only_with_a_checkpoint(tmp_path, capsys, monkeypatch):
    from digenrl.runtime.errors import WorkerFailure

    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", *FAST, "steps=2", "runtime.checkpoint_every=1"]) == 0
    capsys.readouterr()
    _fake_ray_run(monkeypatch, lambda: WorkerFailure("trn0", 2, "train", "RuntimeError: boom"))
    assert main(["train", "--ray", "--resume", str(run), "steps=3"]) == 1
    err = capsys.readouterr().err
    assert f"resume with: digenrl train --resume {run}" in err
    assert (run / "checkpoints").is_dir()


def test_deterministic_worker_errors_are_not_retried(tmp_path, monkeypatch):
    """A worker's missing file / bad config / CUDA-less torch: a restart meets it again; no restart, and
    failure.json offers --resume only with a checkpoint."""
    import digenrl.runtime.driver as driver
    from digenrl.config import load_config
    from digenrl.faults import find_deterministic
    from digenrl.runtime.run_outputs import RunOutputs
    from digenrl.runtime.errors import WorkerFailure

    def failure(exc):
        try:
            try:
                raise exc
            except Exception as inner:
                raise WorkerFailure("gen0", 1, "generate", repr(inner)) from inner
        except WorkerFailure as e:
            return e

    assert find_deterministic(failure(FileNotFoundError("weights.bin")))
    assert find_deterministic(failure(AssertionError("Torch not compiled with CUDA enabled")))
    assert find_deterministic(failure(RuntimeError("Found no NVIDIA driver on your system")))
    assert find_deterministic(failure(ModuleNotFoundError("No module named 'paddleocr'")))
    assert not find_deterministic(failure(RuntimeError("connection reset")))

    cfg = load_config(None, [f"run_dir={tmp_path / 'run'}", *FAST, "runtime.mode=gap", "runtime.max_restarts=3"])
    out = RunOutputs(cfg)

    class Pools:
        def kill(self):
            pass

        def abort(self):
            pass

    attempts = []
    ctl = object.__new__(driver._Controller)
    ctl.cfg, ctl.out, ctl.recoveries, ctl.state, ctl.first, ctl.local = cfg, out, [], None, 0, False
    ctl.start_pools = lambda state, hooks: Pools()
    ctl.run = type("R", (), {"hooks": None, "generator_ids": ("gen0",), "trainer_ids": ("trn0",)})()
    ctl.metrics = type("M", (), {"close": lambda self: None})()
    ctl._restarted = lambda: None
    ctl._recover = lambda e: pytest.fail("a deterministic error was retried")

    def attempt():
        attempts.append(1)
        raise failure(FileNotFoundError("reward weights /x/model.pt"))

    ctl._attempt = attempt
    with pytest.raises(WorkerFailure):
        ctl.train()
    out.close()
    assert len(attempts) == 1
    rec = json.loads((tmp_path / "run" / "failure.json").read_text())
    assert rec["restarts"] == 0 and rec["resume"] is None and rec["deterministic"] is True
