"""The glossary of docs/architecture.md names the code that carries each word: every dotted name it cites
(``schedule.layout.Fragment``, ``train.step_math``) exists in ``digenrl``, every path exists in the repository,
and no word is defined twice. Checked by reading the modules' source (no import of torch or ray needed)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "src" / "digenrl"


def glossary_rows() -> list[tuple[str, str, str]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    part = text.split("## Glossary", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in part.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in ("word", "---"):
            rows.append((cells[0], cells[1], cells[2]))
    return rows


def _defined(module_file: Path) -> set[str]:
    tree = ast.parse(module_file.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def resolves(dotted: str) -> bool:
    """``a.b`` (a module or package of digenrl) or ``a.b.Name`` (a top-level name of module a.b)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = PKG.joinpath(*parts[:cut])
        file = base.with_suffix(".py") if not base.is_dir() else base / "__init__.py"
        if file.is_file():
            rest = parts[cut:]
            return not rest or (len(rest) == 1 and rest[0] in _defined(file))
    return False


def test_resolver_can_fail():
    assert resolves("schedule.layout") and resolves("schedule.layout.tile_grid")
    assert not resolves("schedule.layout.no_such_name") and not resolves("no_such_package.x")


def test_every_name_the_glossary_cites_exists():
    rows = glossary_rows()
    assert len(rows) >= 20
    missing = []
    for word, _, code in rows:
        for ref in re.findall(r"`([^`]+)`", code):
            ref = ref.split(" ")[0]
            if ref.startswith("tests/") or ref.endswith("/"):
                if not (ROOT / ref).exists():
                    missing.append((word, ref))
            elif re.fullmatch(r"[a-z_]+(\.[A-Za-z_]+)+", ref) and ref.split(".")[0] in {
                    p.name for p in PKG.iterdir() if p.is_dir()}:
                if not resolves(ref):
                    missing.append((word, ref))
    assert not missing, missing


def test_one_meaning_per_word():
    words = [w.strip("*") for w, _, _ in glossary_rows()]
    assert len(words) == len(set(words)), sorted(w for w in words if words.count(w) > 1)
