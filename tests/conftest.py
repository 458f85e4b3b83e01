
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


# Under xdist (``make test``: whole files per process, ``--no-loadscope-reorder``) the files are handed out in
# collection order, so the longest go first and the two processes end together (longest-processing-time-first).
# A file's length is estimated from its tests' kinds, in seconds as measured on a 2-core machine (--durations): a
# Ray run ~15, another slow test ~4, the rest ~0.2. Only the order changes, never what runs.
_EST_S = {"ray": 15.0, "slow": 4.0, "fast": 0.2}


def pytest_collection_modifyitems(config, items):
    root = Path(__file__).resolve().parents[1]
    est: dict[str, float] = {}
    for item in items:
        path = Path(str(item.fspath)).resolve()
        rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.as_posix()
        name = getattr(item, "originalname", None) or item.name.split("[")[0]
        ray = "ray_local" in getattr(item, "fixturenames", ())
        slow = ray or rel in _SLOW or f"{rel}::{name}" in _SLOW
        if slow:
            item.add_marker(pytest.mark.slow)
        est[str(item.fspath)] = est.get(str(item.fspath), 0.0) + _EST_S["ray" if ray else "slow" if slow else "fast"]
    if hasattr(config, "workerinput"):  # an xdist worker: its collection order is the order files are handed out
        items.sort(key=lambda it: -est[str(it.fspath)])  # stable: a file's tests keep their order
