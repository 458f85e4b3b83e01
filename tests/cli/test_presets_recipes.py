"""The shipped presets are the recipes they cite (issue 21, item 2): every key of ``digenrl.recipes.RECIPES``
(the peer values with their sources) equals the preset's value, except the keys the preset marks
``# DEVIATION: <reason>``; an unmarked difference, a mark on a key that agrees and a mark on a key the table
does not know all fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from digenrl import recipe_base, recipe_check, recipes

ROOT = Path(__file__).resolve().parents[2]
PRESETS = sorted(p.stem for p in (ROOT / "configs").glob("*.yaml"))


def test_every_preset_has_a_recipe():
    assert PRESETS and set(PRESETS) == set(recipes.RECIPES)


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_is_its_recipe(preset):
    assert recipe_check.problems(preset) == []
    rows = recipe_check.compare(preset)
    keys = [r.key for r in rows]
    assert len(keys) == len(set(keys)) and len(rows) >= 30, keys
    for r in rows:  # the reasons are there, in words
        assert r.deviation is None or len(r.deviation.split()) >= 5, (r.key, r.deviation)


def _copy(preset, tmp_path, old, new):
    text = recipe_check.preset_path(preset).read_text()
    assert old in text
    out = tmp_path / f"{preset}.yaml"
    out.write_text(text.replace(old, new, 1))
    return out


def test_an_unmarked_difference_fails(tmp_path):
    path = _copy("sd35_medium", tmp_path, "  lr: 3.0e-4 ", "  lr: 1.0e-4 ")
    assert any("train.lr = 0.0001" in p and "does not mark it DEVIATION" in p
               for p in recipe_check.problems("sd35_medium", path))
    # a default counts as the preset's value: removing a key whose default differs is a difference too
    path = _copy("wan21_14b", tmp_path, "  clip_range: 1.0e-3", "  # clip_range: 1.0e-3")
    assert any(p.startswith("wan21_14b: train.clip_range = 0.2") for p in recipe_check.problems("wan21_14b", path))


def test_marked_difference_passes_and_a_stale_mark_fails(tmp_path):
    path = _copy("sd35_medium", tmp_path, "  lr: 3.0e-4                          # base.py: train.learning_rate",
                 "  lr: 1.0e-4                          # DEVIATION: a lower rate for this test, on purpose")
    assert recipe_check.problems("sd35_medium", path) == []
    path = _copy("flux1_dev", tmp_path, "  lr: 3.0e-4                          # base.py",
                 "  lr: 3.0e-4                          # DEVIATION: said to differ, but it does not")
    assert recipe_check.problems("flux1_dev", path) == ["flux1_dev: train.lr is marked DEVIATION but equals the recipe "
                                                   "(0.0003)"]
    path = _copy("flux1_dev", tmp_path, "  grid_prompts: 8", "  grid_prompts: 8 # DEVIATION: not a recipe key here")
    assert recipe_check.problems("flux1_dev", path) == ["flux1_dev: eval.grid_prompts is marked DEVIATION but the recipe "
                                                   "table has no such key"]


def test_deviation_comments_are_read_with_their_continuation(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text(
        "seed: 1  # DEVIATION: first line\n"
        "         # and its second line\n"
        "train:\n"
        "  lr: 0.1            # DEVIATION: a reason, with a # inside\n"
        "                     # continued\n"
        "  # a section comment at another column ends it\n"
        "  betas: [0.9, 0.99] # not a deviation\n"
        "  note: 'a # in quotes'  # DEVIATION: after a quoted value\n"
        "model:\n"
        "  options:\n"
        "    height: 8        # DEVIATION: nested\n"
    )
    assert recipe_check.deviations(f) == {
        "seed": "first line and its second line",
        "train.lr": "a reason, with a # inside continued",
        "train.note": "after a quoted value",
        "model.options.height": "nested",
    }
    f.write_text("seed: 1  # DEVIATION:\n")
    with pytest.raises(ValueError, match="seed: DEVIATION without a reason"):
        recipe_check.deviations(f)


def test_table_keys_are_config_keys():
    from digenrl.config import Config

    cfg = Config()
    for recipe in recipes.RECIPES.values():
        for pv in recipe.values:
            if pv.key.startswith(("model.options.", "reward")) or pv.key == "model.lora.target_modules":
                continue  # family options, reward tables and the family's LoRA targets are read from the preset
            recipe_check.our_value(cfg, pv.key)  # KeyError names a key the schema does not have
    with pytest.raises(KeyError):
        recipe_check.our_value(cfg, "train.not_a_key")


def test_lora_targets_are_the_family_defaults():
    from digenrl.models.lora import FAMILY_TARGETS

    for family, targets in recipe_base._FAMILY_LORA_TARGETS.items():
        assert list(FAMILY_TARGETS[family]) == targets, family


def test_values_compare_as_config_values():
    assert recipe_check.same(0.038461538, 1 / 26) and recipe_check.same((0.9, 0.999), [0.9, 0.999])
    assert not recipe_check.same(True, 1) and not recipe_check.same(None, 0.0) and not recipe_check.same("group", "global")
    assert recipe_check.same({"ocr": 1}, {"ocr": 1.0}) and not recipe_check.same({"ocr": 1.0}, {"remote": 1.0})
