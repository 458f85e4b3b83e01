"""Load a repository script (``benchmarks/*.py``, ``scripts/*.py``) as a module, for the tests that run them.

pytest puts ``tests/`` on ``sys.path`` (its conftest), so any test imports ``from script_loader import load_script``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str) -> ModuleType:
    """The module of ``ROOT / relative`` (a fresh import each call)."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
