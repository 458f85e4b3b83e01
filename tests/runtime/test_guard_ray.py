"""``eval.guard`` in a Ray mode (it used to be refused outside the single-process loop): the controller waits for
each eval on trainer rank 0, which returns every eval sample, and the guard scores them as in-process."""

from __future__ import annotations

import json

from runtime_helpers import make_cfg


def test_the_guard_scores_every_eval_of_a_ray_run(ray_local, tiny_model, tmp_path):
    from digenrl.runtime.driver import run_training

    run = tmp_path / "run"
    cfg = make_cfg(tiny_model, run, "runtime.mode=naive", "eval.every=1", "eval.guard={drift: {patch: 4}}",
                   "eval.guard_action=checkpoint")
    summary = run_training(cfg, ray=True)
    assert summary["transport"] == "ray" and summary["audit_violations"] == []
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    guarded = [r["step"] for r in rows if "guard/drift" in r]
    assert guarded == [0, 1, 2, 3], guarded  # before RL, after steps 1 and 2, the final eval
    assert all("eval_reward" in r for r in rows if r["step"] in (1, 2) and "reward_mean" in r)
    assert summary["guard"]["drift"]["initial"] == 1.0  # the base samples against themselves
    assert (run / "guard_pre_divergence.safetensors").is_file() or summary["guard_tripped"]
