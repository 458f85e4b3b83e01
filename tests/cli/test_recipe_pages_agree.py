"""The two pages that translate Flow-GRPO keys, docs/recipes.md (its Flow-GRPO table) and docs/from_flow_grpo.md
(generated from ``scripts/from_flow_grpo.py``'s rows), name the same DigenRL key for every Flow-GRPO key both
list, and the same modes for the barrier-only options (they once disagreed on ``mixed_precision``, on
``gradient_accumulation_steps`` and on where ``train.minibatch_split: samples`` runs)."""

from __future__ import annotations

import re

from script_loader import ROOT, load_script


def _recipes_rows() -> list[tuple[str, str, str]]:
    text = (ROOT / "docs" / "recipes.md").read_text()
    table = text[text.index("## Flow-GRPO (`config.*`)"):text.index("## DanceGRPO")]
    rows = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if line.startswith("| `") or line.startswith("| per ") or line.startswith("| zero") or line.startswith("| re-"):
            rows.append((cells[0], cells[1], cells[2] if len(cells) > 2 else ""))
    return rows


def _names(cell: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", cell))


def _expressions(cell: str) -> set[str]:
    """The Flow-GRPO expressions a recipes.md row translates: its first cell without backticks, before any ':'
    (``sample.sde_type``: ``sde`` / ``cps``), split at ' / ', ', ' and ' + '. A compound row (``x GPUs x ...``) is
    its own expression, not the first key it names (``sample.train_batch_size`` has a row of its own)."""
    head = cell.replace("`", "").split(":")[0]
    return {p.strip() for p in re.split(r" / |, | \+ ", head)}


def test_same_digenrl_key_for_every_shared_flow_grpo_key():
    ours = _recipes_rows()
    assert len(ours) > 30
    rows = load_script("scripts/from_flow_grpo.py").ROWS
    checked = 0
    for fg, _, _, key, _, _ in rows:
        if not re.fullmatch(r"[a-z_.]+", key):  # "run_dir + `--resume`", "(none)": not one key
            continue
        first = re.split(r" / |, ", fg)[0].strip()
        match = [r for r in ours if fg in _expressions(r[0]) or first in _expressions(r[0])]
        for flow_grpo, digenrl, _ in match:
            names = _names(digenrl)
            assert key in names or any(n.startswith(key + ":") or n == key.split(".")[-1] for n in names), \
                f"{fg}: from_flow_grpo.md says {key}, recipes.md says {digenrl}"
            checked += 1
    assert checked >= 25


def test_barrier_only_options_name_the_same_modes():
    recipes = (ROOT / "docs" / "recipes.md").read_text()
    text = recipes[recipes.index("## Flow-GRPO (`config.*`)"):] + (ROOT / "docs" / "from_flow_grpo.md").read_text()
    for key, needs in (("train.minibatch_split", "samples"), ("train.zero_adv_refill", "")):
        rows = [line for line in text.splitlines() if f"`{key}" in line and line.startswith("|") and needs in line
                and re.search(r"mode|loop|barrier", line)]  # the rows that say where it runs
        assert rows
        for row in rows:
            assert "single-process" not in row.lower(), row
            assert re.search(r"colocated (or|/) naive|naive, colocated|colocated, naive|naive/colocated", row), row
