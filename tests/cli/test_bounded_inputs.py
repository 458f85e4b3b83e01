"""Bounded inputs (issue 22, item 5): a YAML alias bomb is refused while it is parsed, before anything expands
it, with exit 2 and a message naming the file; aliases in an override value are refused alike; the configs this
program writes itself hold no alias, so a resume still reads them."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from digenrl.config import ConfigError, dump_config, load_config


def bomb(levels: int, width: int = 10) -> str:
    """``width ** levels`` leaves under model.options from a few hundred bytes of YAML."""
    lines = ["model:", "  options:", "    l0: &l0 [" + ", ".join(["1"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"    l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def test_small_alias_bomb_refused(tmp_path):
    p = tmp_path / "bomb.yaml"
    p.write_text(bomb(4))  # 10^4 leaves: small enough that the old loader accepted it quickly
    with pytest.raises(ConfigError, match="alias"):
        load_config(p)


def test_alias_in_override_refused():
    with pytest.raises(ConfigError, match="alias"):
        load_config(None, ["model.options={a: &x [1, 2], b: *x}"])


def test_anchor_without_alias_and_plain_yaml_still_load(tmp_path):
    p = tmp_path / "ok.yaml"
    p.write_text("steps: 3\nmodel:\n  kind: sd3\n  options: {height: 8}\n")
    assert load_config(p).steps == 3


def test_dumped_config_has_no_alias_and_reloads(tmp_path):
    shared = {"weight": 1.0, "scale": [1, 2]}
    cfg = load_config(None, ["steps=2"])
    cfg.reward = {"a": shared, "b": shared}  # one object twice: a plain safe_dump would write &id001/*id001
    dump_config(cfg, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert "*id" not in text and "&id" not in text
    assert load_config(tmp_path / "config.yaml").reward == {"a": shared, "b": shared}


def test_billion_leaf_bomb_exits_2_fast(tmp_path):
    """The 10^9-leaf bomb of the issue (about 520 bytes): refused in seconds with exit 2 and no run_dir."""
    p = tmp_path / "bomb.yaml"
    p.write_text(bomb(9))
    assert p.stat().st_size < 700
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "digenrl.cli", "train", "--config", str(p), f"run_dir={tmp_path / 'run'}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "alias" in r.stderr and "bomb.yaml" in r.stderr
    assert not (tmp_path / "run").exists()
    assert time.monotonic() - t0 < 120


@pytest.mark.parametrize("text, overrides, message", [
    (None, ["train.lr"], r"override 'train.lr' must look like key=value"),
    (None, ["=1"], r"override '=1' has an empty key"),
    (None, ["train..lr=1"], r"override 'train..lr=1' has an empty key"),
    (None, ["steps=3", "steps.more=1"], r"steps.more: 'steps' is not a table"),
    (None, ["seed=" + "1" * (2 ** 20 + 1)], r"override 'seed': its value is \d+ characters \(at most \d+\)"),
    ("- a\n- b\n", [], r"config file '.*c.yaml' must contain a mapping at top level"),
    ("steps: [1\n", [], r"config file '.*c.yaml' is not valid YAML"),
    ("seed: 1\n" + "#" * (2 ** 20), [], r"config file '.*c.yaml' is \d+ bytes \(at most \d+\)"),
])  # fmt: skip
def test_malformed_config_files_and_overrides_are_refused_naming_them(tmp_path, text, overrides, message):
    from digenrl.config.load import MAX_CONFIG_BYTES

    assert MAX_CONFIG_BYTES < 2 ** 20 + 1  # the long cases above are over the bound
    path = None
    if text is not None:
        path = tmp_path / "c.yaml"
        path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path, overrides)
