"""Bad input is refused up front: exit 2, one message naming the cause, nothing created or changed on disk,
before the run directory exists or Ray starts (every case the CLI would otherwise hit as a traceback)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from digenrl.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import tiny_diffusers as td  # noqa: E402

FAST = ["steps=1", "log.progress=false", "train.prompts_per_step=2"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A good tiny SD3 directory with a prompt file and a complete prompt cache (no text encoders)."""
    from digenrl.models.tiny_dit import DEFAULT_BASE

    root = tmp_path_factory.mktemp("inputs")
    model = td.save_sd3(root / "sd3")
    prompts = root / "prompts.txt"
    prompts.write_text("a red cat\na big dog\n")
    td.random_cache(root / "cache", "sd3-test", ["a red cat", "a big dog", ""], td.SD3_COND)
    shutil.copy(DEFAULT_BASE, root / "tiny.safetensors")
    return root


def sd3(files: Path, **over) -> list[str]:
    args = {"model.kind": "sd3", "model.path": files / "sd3", "task.name": "text", "task.prompts_file": files / "prompts.txt",
            "model.prompt_cache_dir": files / "cache", "reward": "{jpeg_compressibility: {weight: 1}}",
            "model.options": "{height: 16, width: 16}", **over}
    return [f"{k}={v}" for k, v in args.items()]


def snapshot(root: Path) -> dict:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(root.rglob("*"))}


def test_good_inputs_pass(files):
    from digenrl.config import load_config
    from digenrl.validate import validate_run

    validate_run(load_config(None, [f"run_dir={files}/new/run", *FAST, *sd3(files)]))
    validate_run(load_config(None, [f"run_dir={files}/new/run", *FAST]))


def _truncate(src: Path, dst: Path) -> Path:
    dst.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    return dst


def _bad_diffusers(files: Path, tmp: Path, edit) -> Path:
    model = tmp / "sd3_bad"
    shutil.copytree(files / "sd3", model)
    edit(model)
    return model


def _plain_safetensors(tmp: Path) -> Path:
    """Weights, but not a tiny_dit checkpoint (no ``tiny_dit_config`` metadata)."""
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp / "plain.safetensors"))
    return tmp / "plain.safetensors"


def _set_json(path: Path, **values) -> None:
    import json

    path.write_text(json.dumps({**json.loads(path.read_text()), **values}))


CASES = {
    "truncated tiny_dit weights": lambda f, t: ([f"model.path={_truncate(f / 'tiny.safetensors', t / 'cut.safetensors')}"],
                                                ["model.path", "truncated"]),
    "not a safetensors file": lambda f, t: ([f"model.path={(t / 'x.safetensors').write_bytes(b'hello world, not weights') and t / 'x.safetensors'}"],
                                            ["model.path", "not a readable safetensors"]),
    "truncated diffusers weights": lambda f, t: (sd3(f, **{"model.path": _bad_diffusers(f, t, lambda m: _truncate(
        m / "transformer/diffusion_pytorch_model.safetensors", m / "transformer/diffusion_pytorch_model.safetensors"))}),
        ["model.path", "diffusion_pytorch_model.safetensors", "truncated"]),
    "diffusers dir without vae": lambda f, t: (sd3(f, **{"model.path": _bad_diffusers(f, t, lambda m: shutil.rmtree(m / "vae"))}),
                                               ["missing", "vae/"]),
    "corrupt diffusers config": lambda f, t: (sd3(f, **{"model.path": _bad_diffusers(f, t, lambda m: (m / "transformer/config.json").write_text("{oops"))}),
                                              ["config.json", "not valid JSON"]),
    "diffusers config value of the wrong type": lambda f, t: (sd3(f, **{"model.path": _bad_diffusers(f, t, lambda m: _set_json(
        m / "transformer/config.json", num_layers="two"))}), ["transformer/config.json", "num_layers", '"two"', "int"]),
    "unknown reward option": lambda f, t: (["reward={digits: {weight: 1, foo: 2}}"], ["reward.digits", "foo"]),
    "unknown reward": lambda f, t: (["reward={digitz: {weight: 1}}"], ["reward.digitz", "unknown reward"]),
    "reward weight not a number": lambda f, t: (["reward={digits: {weight: heavy}}"], ["reward.digits.weight"]),
    "run_dir is a file": lambda f, t: ([f"run_dir={(t / 'afile').write_text('x') and t / 'afile'}"], ["run_dir", "not a directory"]),
    "run_dir under a file": lambda f, t: ([f"run_dir={(t / 'bfile').write_text('x') and t / 'bfile' / 'run'}"], ["run_dir", "not a directory"]),
    "text task with the tiny model": lambda f, t: ([f"task.name=text", f"task.prompts_file={f / 'prompts.txt'}"],
                                                   ["task.name", "tiny_dit"]),
    "digits task with a diffusers model": lambda f, t: (sd3(f, **{"task.name": "digits"}), ["task.name", "digits"]),
    "missing prompt file": lambda f, t: (sd3(f, **{"task.prompts_file": t / "nope.txt"}), ["task.prompts_file", "nope.txt"]),
    "more prompts per step than prompts": lambda f, t: (sd3(f, **{"train.prompts_per_step": 3}), ["train.prompts_per_step=3"]),
    "prompt missing from the cache": lambda f, t: (sd3(f, **{"task.prompts_file": (t / "p.txt").write_text("a red cat\na blue dog\n") and t / "p.txt"}),
                                                   ["model.prompt_cache_dir", "not in the cache", "a blue dog"]),
    "unknown model kind": lambda f, t: (["model.kind=sd35"], ["model.kind", "unknown policy kind 'sd35'"]),
    "safetensors without tiny_dit metadata": lambda f, t: ([f"model.path={_plain_safetensors(t)}"],
                                                           ["model.path", "not a tiny_dit checkpoint"]),
    "unknown task": lambda f, t: (["task.name=digitz"], ["task.name", "unknown task 'digitz'"]),
    "text task without a prompt file": lambda f, t: (sd3(f, **{"task.prompts_file": "null"}),
                                                     ["task.prompts_file", "required"]),
    "no prompt cache without text encoders": lambda f, t: (sd3(f, **{"model.prompt_cache_dir": "null"}), ["model.prompt_cache_dir", "required"]),
}


# the Ray modes share the checks; two cases show that they run before Ray starts
RUNS = [(c, "colocated") for c in sorted(CASES)] + [(c, "gap_tsp") for c in ("truncated tiny_dit weights",
                                                                               "prompt missing from the cache",
                                                                               "diffusers config value of the wrong type")]


@pytest.mark.parametrize("case,mode", RUNS)
def test_bad_input_exits_2_and_writes_nothing(files, tmp_path, capsys, monkeypatch, case, mode):
    import ray

    import digenrl.runtime.driver as driver

    def never(*a, **k):  # the checks run before Ray starts or any actor is created (order-independent)
        raise AssertionError("Ray or a worker was started for a config that should have been refused")

    monkeypatch.setattr(ray, "init", never)
    monkeypatch.setattr(driver._Controller, "start_pools", never)  # (Ray's or in-process workers)
    args, needles = CASES[case](files, tmp_path)
    run = tmp_path / "run"
    if not any(a.startswith("run_dir=") for a in args):
        args = [f"run_dir={run}", *args]
    before, inputs = snapshot(tmp_path), snapshot(files)
    assert main(["train", *FAST, f"runtime.mode={mode}", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("digenrl: error: ") and len(err.strip().splitlines()) == 1, err
    for n in needles:
        assert n in err, (n, err)
    assert snapshot(tmp_path) == before and snapshot(files) == inputs and not run.exists()


def test_long_values_are_cut(files, tmp_path, capsys):
    prompts = tmp_path / "long.txt"
    prompts.write_text("a red cat\n" + "x" * 1_000_000 + "\n")
    assert main(["train", f"run_dir={tmp_path}/run", *FAST, *sd3(files, **{"task.prompts_file": prompts})]) == 2
    err = capsys.readouterr().err
    assert "not in the cache" in err and len(err) < 600, len(err)


@pytest.mark.parametrize("where", ["under a file", "read-only dir"])
def test_unwritable_run_dir(tmp_path, capsys, where):
    """A run_dir that cannot be created is refused (exit 2, naming run_dir) before anything is written. The first
    cannot be created even by root (CI runs as root): a path whose parent is a regular file."""
    if where == "read-only dir" and os.geteuid() == 0:
        pytest.skip("root may write anywhere: permissions cannot refuse it")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    ro = tmp_path / "ro"
    ro.mkdir()
    run = {"under a file": blocker / "run", "read-only dir": ro / "run"}[where]
    before = snapshot(tmp_path)
    ro.chmod(0o500)
    try:
        assert main(["train", f"run_dir={run}", *FAST]) == 2
        assert "run_dir" in capsys.readouterr().err and not run.exists()
    finally:
        ro.chmod(0o700)
    assert snapshot(tmp_path) == before and blocker.read_text() == "not a directory"


@pytest.mark.parametrize("command", ["eval", "sample"])
def test_eval_and_sample_refuse_a_truncated_model(files, tmp_path, capsys, command):
    cut = _truncate(files / "tiny.safetensors", tmp_path / "cut.safetensors")
    before = snapshot(tmp_path)
    extra = ["--out", str(tmp_path / "grid.png")] if command == "sample" else []
    assert main([command, *extra, f"model.path={cut}"]) == 2
    assert "truncated" in capsys.readouterr().err and snapshot(tmp_path) == before
