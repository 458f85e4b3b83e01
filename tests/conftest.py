
from pathlib import Path

import pytest
import torch

# Keep the suite predictable on small CI machines.
torch.set_num_threads(1)  # tiny models: 1 thread avoids OpenMP oversubscription


@pytest.fixture
def tiny_policy():
    from digenrl.models.tiny_dit import TinyDiTConfig, TinyDiTPolicy

    torch.manual_seed(0)
    return TinyDiTPolicy(TinyDiTConfig(dim=32, depth=1, heads=2))


# ``make test-fast`` (``-m "not slow"``): tests/slow.txt lists the slow tests by path or path::function (measured
# with ``pytest --durations=0``); every test that starts a local Ray (the ``ray_local`` fixture) is slow too.
_SLOW_LIST = Path(__file__).with_name("slow.txt")
_SLOW = {ln.strip() for ln in _SLOW_LIST.read_text().splitlines() if ln.strip() and not ln.startswith("#")}


def pytest_collection_modifyitems(config, items):
    root = Path(__file__).resolve().parents[1]
    for item in items:
        path = Path(str(item.fspath)).resolve()
        rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.as_posix()
        name = getattr(item, "originalname", None) or item.name.split("[")[0]
        if rel in _SLOW or f"{rel}::{name}" in _SLOW or "ray_local" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
