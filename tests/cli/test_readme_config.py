"""The README's configuration reference names every config key (so the table cannot silently fall behind)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _keys(model_cls, prefix=""):
    for name, field in model_cls.model_fields.items():
        sub = field.annotation
        if isinstance(sub, type) and hasattr(sub, "model_fields"):
            yield from _keys(sub, prefix + name + ".")
        else:
            yield prefix + name


def test_every_config_key_is_in_the_readme_table():
    from digenrl.config import Config

    text = README.read_text()
    table = text[text.index("## Configuration reference"):text.index("## The math")]
    named = set(re.findall(r"`([a-z_.{},]+)`", table))
    expanded = set()
    for n in named:  # `model.lora.{enabled,rank}` names model.lora.enabled and model.lora.rank
        m = re.fullmatch(r"(.*)\{(.*)\}", n)
        expanded.update(m.group(1) + k for k in m.group(2).split(",")) if m else expanded.add(n)
    keys = list(_keys(Config))
    assert len(keys) > 50
    missing = [k for k in keys if k not in expanded]
    assert not missing, f"config keys missing from the README table: {missing}"
