"""The shared ending of the doc generators: write the page, or (``--check``) say whether it is up to date."""

from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(out: Path, text: str, check: bool, script: str, root: Path) -> int:
    """``check``: exit code 1 (with a message naming ``script``) when ``out`` differs from ``text``, else 0;
    otherwise write ``text`` to ``out``."""
    rel = out.relative_to(root)
    if check:
        if not out.is_file() or out.read_text() != text:
            print(f"{rel} is out of date: run python {script}", file=sys.stderr)
            return 1
        return 0
    out.write_text(text)
    print(f"wrote {rel}")
    return 0
