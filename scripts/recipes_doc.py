"""Write the presets section of docs/recipes.md: each shipped preset against the peer recipe it cites, key by key.

    python scripts/recipes_doc.py            # (re)write the section between the markers in docs/recipes.md
    python scripts/recipes_doc.py --check    # exit 1 if the section is not what this script writes

Our values are read from the presets (``configs/*.yaml`` loaded with ``digenrl.config.load_config``, defaults
included), the peer values and their sources from ``digenrl.recipes.RECIPES``, the reasons from the presets'
``# DEVIATION:`` comments. Only the text between the two markers is written; the rest of the page (the key
translation tables) is left as it is. The section goes before the Flow-GRPO key table when the page has no
markers yet.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from doc_check import write_or_check  # noqa: E402
OUT = ROOT / "docs" / "recipes.md"
BEGIN = "<!-- BEGIN presets: written by scripts/recipes_doc.py from src/digenrl/recipes.py and configs/*.yaml -->"
END = "<!-- END presets -->"
ANCHOR = "## Flow-GRPO (`config.*`)"


def _fmt(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.1f}" if v.is_integer() and abs(v) < 1e6 else f"{v:.8g}"
    if isinstance(v, str):
        return repr(v).replace("'", '"') if v.strip() != v or not v else v
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_fmt(x)}" for k, x in v.items()) + "}"
    return str(v)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(v) -> str:
    return f"`{_cell(_fmt(v))}`"


def section() -> str:
    from digenrl.recipe_check import compare
    from digenrl.recipes import RECIPES

    rows = {name: compare(name) for name in RECIPES}
    lines = [
        BEGIN,
        "## The presets and their recipes",
        "",
        *textwrap.wrap(
            "Each shipped preset against the recipe it cites, key by key: our value (what the preset runs with, "
            "defaults included), the peer's value in DigenRL's terms, the peer's own setting and where it is "
            "(`src/digenrl/recipes.py` holds the peer values with their sources). A key whose value differs is "
            "marked in the preset with `# DEVIATION: <reason>`; `tests/cli/test_presets_recipes.py` fails on an "
            "unmarked difference and on a mark where the values agree. Peer behaviours that no DigenRL key "
            "selects are listed under each table; they are described, not compared.", width=115),
        "",
        "### Remaining differences",
        "",
        "| preset | key | ours | peer | why |",
        "|---|---|---|---|---|",
    ]
    for name, rs in rows.items():
        for r in rs:
            if r.differs:
                lines.append(f"| `{name}` | `{r.key}` | {_code(r.ours)} | {_code(r.peer.value)} | "
                             f"{_cell(r.deviation or '(not marked)')} |")
    for name, recipe in RECIPES.items():
        lines += [
            "",
            f"### `configs/{name}.yaml`: {recipe.title}",
            "",
            *textwrap.wrap(f"Read from {recipe.sources}.", width=115),
            "",
            "| DigenRL key | ours | peer | peer setting | source | |",
            "|---|---|---|---|---|---|",
        ]
        for r in rows[name]:
            mark = f"**DEVIATION**: {_cell(r.deviation)}" if r.differs else ""
            lines.append(f"| `{r.key}` | {_code(r.ours)} | {_code(r.peer.value)} | `{_cell(r.peer.peer)}` | "
                         f"`{_cell(r.peer.source)}` | {mark} |")
        if recipe.quirks:
            lines += ["", "Peer behaviours no key selects:", ""]
            lines += [f"- {q}" for q in recipe.quirks]
    lines += ["", END]
    return "\n".join(lines) + "\n"


def render(page: str) -> str:
    """``page`` with its presets section replaced by (or, without markers, given) the current one."""
    new = section()
    if BEGIN in page and END in page:
        head, rest = page.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        return head + new.rstrip("\n") + tail
    if ANCHOR not in page:
        raise ValueError(f"{OUT.relative_to(ROOT)} has neither the presets markers nor {ANCHOR!r}")
    head, tail = page.split(ANCHOR, 1)
    return head + new + "\n" + ANCHOR + tail


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/recipes.md is not up to date")
    args = ap.parse_args(argv)
    return write_or_check(OUT, render(OUT.read_text()), args.check, "scripts/recipes_doc.py", ROOT)


if __name__ == "__main__":
    sys.exit(main())
