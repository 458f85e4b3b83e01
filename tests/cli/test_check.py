"""``digenrl check`` (issue 38, item 4): validates, resolves the preset, prints the resolved config, the memory plan
and the planned split, and exits without starting Ray: checked in a fresh process where importing ray fails (and,
for ``--config-only``, torch too, as the planning path in ``tests/arch/test_layering.py``)."""

from __future__ import annotations

import subprocess
import sys

import yaml

BLOCK = (
    "import sys\n"
    "class Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] in {blocked!r}:\n"
    "            raise ImportError('blocked: ' + name)\n"
    "sys.meta_path.insert(0, Block())\n"
    "from digenrl.cli import main\n"
    "rc = main({argv!r})\n"
    "bad = [m for m in sys.modules if m.split('.')[0] in {blocked!r}]\n"
    "assert not bad, bad\n"
    "sys.exit(rc)\n")


def _check(argv, blocked=("ray",), cwd=None):
    code = BLOCK.format(blocked=tuple(blocked), argv=["check", *argv])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_preset_by_name_without_ray_or_torch():
    from digenrl.config import load_config
    from digenrl.presets import preset_path

    out = _check(["--config", "preset:flux1_dev", "--config-only"], blocked=("ray", "torch"))
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    resolved = yaml.safe_load(text[:text.index("memory plan")])
    cfg = load_config(preset_path("flux1_dev"))
    assert resolved["model"] == cfg.model.model_dump(mode="json") and resolved["steps"] == cfg.steps
    rt = cfg.runtime
    assert f"mode {rt.mode}: {rt.generators} generator(s) + {rt.trainers} trainer rank(s)" in text
    assert "trainer rank: " in text and "train.memory_gb=80" in text  # the memory plan per rank
    assert f"{cfg.train.prompts_per_step} prompts x {cfg.train.generations} generations" in text
    assert "inputs: not checked (--config-only)" in text


def test_default_demo_ready_and_a_missing_file_refused(tmp_path):
    out = _check(["-q", "runtime.mode=gap_tsp_tag", f"run_dir={tmp_path / 'run'}"])
    assert out.returncode == 0, out.stderr[-2000:]
    assert "1 generator(s) + 1 trainer rank(s) = 2 workers" in out.stdout
    assert "inputs: ok" in out.stdout
    out = _check(["-q", "task.name=text", f"task.prompts_file={tmp_path / 'nope.txt'}", f"run_dir={tmp_path / 'run'}"])
    assert out.returncode == 2
    assert "  task.name: the text task needs a diffusers model.kind" in out.stdout
    assert not (tmp_path / "run").exists()  # nothing written


def test_config_errors_exit_2_in_one_line():
    out = _check(["train.lrr=1"], blocked=("ray", "torch"))
    assert out.returncode == 2
    assert out.stderr.strip() == "digenrl: error: train.lrr: unknown key; did you mean train.lr?"
    out = _check(["--config", "preset:flux_dev"], blocked=("ray", "torch"))
    assert out.returncode == 2 and "did you mean preset:flux1_dev?" in out.stderr
    out = _check(["--config", "preset:flux1_dev", "--config-only", "train.memory_gb=8"], blocked=("ray", "torch"))
    assert out.returncode == 2 and "memory plan:" in out.stderr and "train.memory_gb=8" in out.stderr
