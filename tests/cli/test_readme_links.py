"""README.md is a front door: under 250 lines, and every link and image in it points at a file of the repository
(anchors at a heading of the linked page, slugged as the docs site slugs them), so a moved or renamed docs page
breaks this test. (Links inside docs/ are checked by ``make docs``: mkdocs --strict.)"""

from __future__ import annotations

import re
import unicodedata

from script_loader import ROOT

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """Python-Markdown's toc slug (what mkdocs uses for anchors)."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page) -> set[str]:
    out = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            out.add(slug(line.lstrip("#").strip()))
    return out


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) < 250


def test_every_readme_link_resolves():
    text = (ROOT / "README.md").read_text()
    links = [u for u in LINK.findall(text) if not re.match(r"[a-z]+://", u)]
    assert len(links) > 15
    for url in links:
        path, _, anchor = url.partition("#")
        target = ROOT / path
        assert target.is_file(), f"README links to {url}: no such file"
        if anchor:
            assert anchor in anchors(target), f"README links to {url}: no heading with that anchor"


def test_slug_matches_the_site():
    assert slug("What a run says and writes") == "what-a-run-says-and-writes"
    assert slug("Per algorithm (`train.algorithm`)") == "per-algorithm-trainalgorithm"
