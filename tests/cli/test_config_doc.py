"""docs/configuration.md is the config schema's: every key (and every ``model.options`` option of every family)
has a description in the schema, the page names every key with its default, and the page is what
``scripts/config_doc.py`` writes now (a key added without re-running the script fails here)."""

from __future__ import annotations

import json

import pytest

from script_loader import ROOT, load_script


def _keys(model, prefix=""):
    for name, field in model.model_fields.items():
        sub = field.annotation
        if isinstance(sub, type) and hasattr(sub, "model_fields"):
            yield from _keys(sub, prefix + name + ".")
        else:
            yield prefix + name, field


def test_every_key_has_a_description():
    from digenrl.config import Config
    from digenrl.model_options import FAMILY_OPTIONS

    keys = list(_keys(Config))
    assert len(keys) > 100
    assert not [k for k, f in keys if len((f.description or "").split()) < 2], "keys without a description"
    options = [(n, f) for m in FAMILY_OPTIONS.values() for n, f in m.model_fields.items()]
    assert options and not [n for n, f in options if not (f.description or "").strip()]


def test_the_page_names_every_key_with_its_default():
    from digenrl.config import Config

    text = (ROOT / "docs" / "configuration.md").read_text()
    for key, field in _keys(Config):
        default = field.default.value if hasattr(field.default, "value") else field.default
        assert f"| `{key}` |" in text, key
        row = text[text.index(f"| `{key}` |"):].split("\n", 1)[0]
        assert f"`{json.dumps(default)}`" in row, (key, row)
        assert " ".join(field.description.split()) in row.replace("\\|", "|"), key


def test_the_page_is_up_to_date():
    doc = load_script("scripts/config_doc.py")
    assert doc.main(["--check"]) == 0, "docs/configuration.md is out of date: run python scripts/config_doc.py"


def test_a_key_without_description_stops_the_script():
    from pydantic import BaseModel, ConfigDict

    doc = load_script("scripts/config_doc.py")

    class Bad(BaseModel):
        model_config = ConfigDict(use_attribute_docstrings=True)
        documented: int = 1
        """Has one."""
        bare: int = 2

    with pytest.raises(ValueError, match="bare: no description"):
        doc.rows(Bad)


def test_planner_outputs_and_expert_knobs_are_documented_apart():
    """The planner's outputs and tuning knobs have their own section, `tuning` (and `tuning.bts`), whose intro
    names every old key an older config may still set (``config.load.MOVED``); a user's key stays where it was,
    and no old key is documented as a key any more."""
    from digenrl.config import MOVED

    doc = load_script("scripts/config_doc.py")
    page = doc.render()
    main, rest = page.split("## `tuning`\n", 1)
    tuning, rest = rest.split("\n## `tuning.bts`\n", 1)
    bts = rest.split("\n## ", 1)[0]
    intro = tuning.split("| key |", 1)[0]
    for key in ("tuning.stale_hold", "tuning.gang_groups", "tuning.tag_inference_copy", "tuning.calibration_repeats",
                "tuning.loss_scale_init"):
        assert f"| `{key}` |" in tuning and f"| `{key}` |" not in main, key
    assert "| `tuning.bts.depth` |" in bts and "| `tuning.bts.depth` |" not in main
    assert "digenrl plan" in intro and "notice" in intro
    for old in MOVED:
        assert f"`{old}" in intro, old  # the intro says which old keys are read in their new homes
        assert f"| `{old}" not in page, old
    for key in ("train.lr", "runtime.mode", "runtime.calibration.when", "runtime.tag_policy"):
        assert f"| `{key}` |" in main and f"| `{key}` |" not in tuning + bts, key
