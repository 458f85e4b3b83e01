"""docs/recipes.md's presets section is what scripts/recipes_doc.py writes from the presets and the peer table
(src/digenrl/recipes.py): up to date, every remaining difference listed with its reason, the rest of the page
kept as it is."""

from __future__ import annotations

from script_loader import load_script


def test_page_is_up_to_date():
    mod = load_script("scripts/recipes_doc.py")
    assert mod.main(["--check"]) == 0, "run python scripts/recipes_doc.py"


def test_section_lists_every_difference_with_its_reason():
    from digenrl.recipe_check import compare
    from digenrl.recipes import RECIPES

    mod = load_script("scripts/recipes_doc.py")
    text = mod.section()
    for name in RECIPES:
        assert f"### `configs/{name}.yaml`" in text
        for r in compare(name):
            if r.differs:
                assert f"| `{name}` | `{r.key}` |" in text and r.deviation.split()[0] in text
    assert "| `train.minibatches_per_step` | `2` | `2` |" in text


def test_render_keeps_the_rest_of_the_page():
    mod = load_script("scripts/recipes_doc.py")
    page = f"# T\n\nintro\n\n{mod.BEGIN}\nstale text\n{mod.END}\n\n## Flow-GRPO (`config.*`)\n\nrest\n"
    out = mod.render(page)
    assert out.startswith("# T\n\nintro\n\n" + mod.BEGIN)
    assert out.endswith(f"{mod.END}\n\n## Flow-GRPO (`config.*`)\n\nrest\n")
    assert "stale text" not in out and mod.render(out) == out
    fresh = mod.render("# T\n\n## Flow-GRPO (`config.*`)\n\nrest\n")  # no markers yet: goes before the key table
    assert fresh.index(mod.BEGIN) < fresh.index("## Flow-GRPO") and mod.render(fresh) == fresh
