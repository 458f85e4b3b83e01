"""A shipped preset against the peer recipe it cites (``recipes.RECIPES``), key by key.

A preset equals its recipe key by key, except where its YAML marks the key ``# DEVIATION: <reason>`` (the reason
may continue on the comment lines below, aligned with the ``#``). ``compare`` lists every entry with our value,
the peer's and the mark; ``problems`` says what does not match (``tests/cli/test_presets_recipes.py`` fails on
an unmarked difference and on a mark where the values agree); ``scripts/recipes_doc.py`` renders the same rows
into docs/recipes.md.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .presets import preset_path
from .recipe_base import PeerValue
from .recipes import RECIPES


def our_value(cfg, key: str) -> Any:
    """The value ``cfg`` (a loaded ``Config``) runs with for ``key`` (defaults included). ``reward`` is
    ``{name: weight}``; ``model.lora.target_modules`` null is the family's list (``models.lora.FAMILY_TARGETS``).
    A key the config does not have raises ``KeyError`` naming it."""
    if key == "reward":
        return {name: float(spec.get("weight", 1.0)) for name, spec in cfg.reward.items()}
    parts = key.split(".")
    if parts[0] == "reward":
        if len(parts) != 3 or parts[1] not in cfg.reward:
            raise KeyError(key)
        return cfg.reward[parts[1]].get(parts[2])
    node: Any = cfg
    for i, part in enumerate(parts):
        if isinstance(node, dict):
            if part not in node:
                if parts[:i] == ["model", "options"]:
                    return None  # an option left to the family default
                raise KeyError(key)
            node = node[part]
        elif part in getattr(type(node), "model_fields", {}):
            node = getattr(node, part)
        else:
            raise KeyError(key)
    if key == "model.lora.target_modules" and node is None:
        from .models.lora import FAMILY_TARGETS

        node = list(FAMILY_TARGETS[cfg.model.kind])
    return node


def same(a: Any, b: Any) -> bool:
    """Equal as config values: floats to 1e-6 relative (1/26 is written 0.038461538), tuples = lists."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=0.0)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


_KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w.-]*):(?P<rest>.*)$")


def deviations(path: str | Path) -> dict[str, str]:
    """``{dotted key: reason}`` for every key of the YAML file marked ``# DEVIATION: <reason>`` on its line; the
    reason continues on the comment-only lines right below whose ``#`` is in the same column."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing mappings
    open_key, open_col = None, -1
    for line in Path(path).read_text().splitlines():
        stripped = line.lstrip(" ")
        if stripped.startswith("#"):
            if open_key is not None and len(line) - len(stripped) == open_col:
                out[open_key] += " " + stripped[1:].strip()
            else:
                open_key = None
            continue
        open_key = None
        m = _KEY_LINE.match(line)
        if not m:
            continue
        indent = len(m["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        dotted = ".".join([k for _, k in stack] + [m["key"]])
        stack.append((indent, m["key"]))
        rest = m["rest"]
        hash_at = _comment_start(rest)
        if hash_at is None:
            continue
        comment = rest[hash_at + 1:].strip()
        if comment.startswith("DEVIATION:"):
            reason = comment[len("DEVIATION:"):].strip()
            if not reason:
                raise ValueError(f"{path}: {dotted}: DEVIATION without a reason")
            out[dotted] = reason
            open_key, open_col = dotted, len(line) - len(rest) + hash_at
    return out


def _comment_start(rest: str) -> int | None:
    """Index of the ``#`` starting a comment in a YAML value (outside quotes), or None."""
    quote = None
    for i, ch in enumerate(rest):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or rest[i - 1] in " \t"):
            return i
    return None


@dataclass(frozen=True)
class Row:
    key: str
    ours: Any
    peer: PeerValue
    deviation: str | None  # the marked reason, if any

    @property
    def differs(self) -> bool:
        return not same(self.ours, self.peer.value)


def compare(preset: str, path: str | Path | None = None) -> list[Row]:
    """Every entry of ``preset``'s recipe with our value (from ``path``, default ``configs/<preset>.yaml``) and its
    DEVIATION mark (on the key or on an enclosing one)."""
    from .config import load_config

    path = preset_path(preset) if path is None else Path(path)
    cfg = load_config(path)
    marks = deviations(path)
    rows = []
    for pv in RECIPES[preset].values:
        prefixes = (pv.key.rsplit(".", i)[0] for i in range(pv.key.count(".") + 1))  # the key, then its parents
        rows.append(Row(pv.key, our_value(cfg, pv.key), pv, next((marks[k] for k in prefixes if k in marks), None)))
    return rows


def problems(preset: str, path: str | Path | None = None) -> list[str]:
    """What makes the preset not its recipe: an unmarked difference, a mark where the values agree, a mark on a
    key the recipe does not list. Empty when the preset is the recipe up to its marked deviations."""
    path = preset_path(preset) if path is None else Path(path)
    rows = compare(preset, path)
    marks = deviations(path)
    out = []
    for r in rows:
        if r.differs and r.deviation is None:
            out.append(f"{preset}: {r.key} = {r.ours!r}, the recipe has {r.peer.value!r} ({r.peer.peer}; "
                       f"{r.peer.source}) and the YAML does not mark it DEVIATION")
        if not r.differs and r.key in marks:
            out.append(f"{preset}: {r.key} is marked DEVIATION but equals the recipe ({r.ours!r})")
    known = {r.key for r in rows}
    for key in marks:
        if not any(k == key or k.startswith(key + ".") for k in known):
            out.append(f"{preset}: {key} is marked DEVIATION but the recipe table has no such key")
    return out
