"""The Ray runtime decides TAG with ``runtime.tag_policy`` (the scheduler's ``BTSConfig`` from the config)."""

from __future__ import annotations

import json

from runtime_helpers import make_cfg
from test_sharded_pool import _profile


def test_runtime_follows_the_tag_policy(ray_local, tiny_model, tmp_path):
    """With a profile under which BTS inserts TAG (test_sharded_pool), ``tag_policy=none`` inserts none."""
    from digenrl.runtime.driver import run_training

    run = tmp_path / "run"
    cfg = make_cfg(tiny_model, run, "runtime.mode=gap_tsp_tag", "runtime.tag_policy=none",
                   f"runtime.profile={_profile(tmp_path / 'profile.json')}")
    summary = run_training(cfg, ray=True)
    assert summary["audit_violations"] == [] and summary["version"] == cfg.steps
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert sum(r.get("tag_fragments", 0) for r in rows) == 0
