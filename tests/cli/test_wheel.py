"""The built wheel is a complete install (issue 38, item 5): it carries the presets, and after ``pip install`` of
the wheel into a fresh virtual environment ``digenrl check --config preset:flux1_dev`` works.

How, without downloading torch again: the wheel is built from a copy of the sources (``pip wheel --no-deps
--no-build-isolation``, with this interpreter's setuptools); a fresh venv is made without system site packages
(``python -m venv``), the wheel installed into it with ``--no-deps``, and the dependencies are taken from this
interpreter's site-packages through a ``.pth`` file that appends that directory to ``sys.path``: a path line in a
``.pth`` file is only appended, the ``.pth`` files inside it (an editable install's finder) are not run, so the
repository's sources cannot stand in for missing package data. The check runs from an empty directory with
``PYTHONPATH`` unset and ``PYTHONNOUSERSITE=1``, and the test asserts the package came from the fresh venv."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

from script_loader import ROOT


def test_wheel_ships_the_presets_and_checks_one(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, src / f)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")} | {"PYTHONNOUSERSITE": "1"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(src)], check=True, env=env, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("digenrl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    presets = sorted(n for n in names if n.startswith("digenrl/configs/") and n.endswith(".yaml"))
    assert "digenrl/configs/flux1_dev.yaml" in presets and len(presets) == len(list((ROOT / "configs").glob("*.yaml")))

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=env, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, env=env).stdout.strip()
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)],
                   check=True, env=env, timeout=300)
    deps = sysconfig.get_paths()["purelib"]  # this interpreter's packages (torch, pydantic, ...), appended last
    with open(os.path.join(site, "zz_deps_from_test_env.pth"), "w") as f:
        f.write(deps + "\n")
    run = tmp_path / "empty"
    run.mkdir()
    where = subprocess.run([str(py), "-c", "import digenrl, sys; print(digenrl.__file__)"], cwd=run, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(site), where  # the wheel's copy, not the repository's sources
    out = subprocess.run([str(venv / "bin" / "digenrl"), "check", "--config", "preset:flux1_dev", "--config-only",
                          "-q"], cwd=run, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "planned split:" in out.stdout and "memory plan" in out.stdout
    out = subprocess.run([str(venv / "bin" / "digenrl"), "check", "--config", "preset:flux1_dev", "-q"], cwd=run,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "model.path: diffusers directory '/models/FLUX.1-dev' does not exist" in out.stdout
