"""``scripts/mutants.py`` (the mutation check the project keeps) stays runnable: every mutant's old text is in
the source exactly once and its test files exist, so a change to a mutated line updates the list with it; a
stale mutant stops the script with exit 2, naming it. (Running the mutants takes minutes: not here.)"""

from __future__ import annotations

import importlib.util
import sys

from script_loader import ROOT


def load_script(relative: str):
    """The script as a module, registered in ``sys.modules`` (its dataclasses need their module there)."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location("digenrl_mutants_script", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_every_mutant_applies_to_the_current_source():
    mod = load_script("scripts/mutants.py")
    assert len(mod.MUTANTS) >= 10 and len({m.name for m in mod.MUTANTS}) == len(mod.MUTANTS)
    sites = mod.plan_sites(ROOT, mod.MUTANTS)  # SetupError naming each stale mutant
    assert all(sites[m.name] for m in mod.MUTANTS)
    for m in mod.MUTANTS:
        for s in sites[m.name]:
            assert s.old != s.new, m.name


def test_a_stale_mutant_stops_the_script_naming_it(capsys, monkeypatch):
    mod = load_script("scripts/mutants.py")
    stale = mod._m("a stale one", "src/digenrl/schedule/audit.py", "no such text anywhere", "x",
                   ["tests/schedule/test_audit_rejects.py"])
    monkeypatch.setattr(mod, "MUTANTS", (stale,))
    assert mod.main(["--json"]) == 2
    err = capsys.readouterr().err
    assert "mutant 'a stale one': old text not found in src/digenrl/schedule/audit.py" in err
