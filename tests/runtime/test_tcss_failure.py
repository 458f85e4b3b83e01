"""TCSS (``full``): bounded staleness from the run's own records; failures: a clear error, no partial commit."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from runtime_helpers import make_cfg


@pytest.mark.parametrize("publish", ["object_store", "stream"])
def test_full_mode_staleness_bounds(ray_local, tiny_model, tmp_path, publish):
    """(stream: the trainers go on while the generators receive; the audit checks that no commit starts before
    the version is out and that the publish holds the generators only)"""
    from digenrl.runtime.driver import run_training

    run = tmp_path / "run"
    cfg = make_cfg(tiny_model, run, "runtime.mode=full", "steps=4", "runtime.max_stale_fraction=0.5",
                   "train.lr=3e-4", f"runtime.publish={publish}")  # lr: a stale sample's ratio shows
    summary = run_training(cfg, ray=True)
    assert summary["audit_violations"] == []
    cap = int(0.5 * cfg.train.prompts_per_step * cfg.train.generations)
    trajs = [json.loads(x) for x in (run / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajs) == cfg.steps * 8
    stale, frag_versions = defaultdict(int), defaultdict(set)
    for t in trajs:  # (step N from 1, as metrics.jsonl's rows; on-policy: version N - 1)
        assert t["version"] in (t["step"] - 1, t["step"] - 2), t      # staleness <= 1
        stale[t["step"]] += t["version"] == t["step"] - 2
        frag_versions[(t["step"], t["uid"], tuple(t["fragment"]))].add(t["version"])
    assert all(n <= cap for n in stale.values()), stale               # stale share <= cap
    assert all(len(v) == 1 for v in frag_versions.values())           # one version per fragment
    assert stale[1] == 0 and sum(stale.values()) > 0, "TCSS never ran: the test would prove nothing"
    assert not any(t["tag"] and t["version"] != t["step"] - 1 for t in trajs)  # TAG is on-policy
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if "reward_mean" in x]
    for r in rows:  # behaviour log-probs are logp_old: stale samples give a nonzero ratio, fresh ones none
        k = r["step"]  # the same step numbers as trajectories.jsonl's
        assert r["staleness/1"] == stale[k] and r["stale_fraction"] == stale[k] / 8
        if stale[k] == 0:
            assert r["approx_kl"] < 1e-9
        else:
            assert r["approx_kl"] > 1e-9


@pytest.mark.parametrize("hook,worker,step", [("gen0@3:exit", "gen0", 3), ("trn0@2", "trn0", 2)])
def test_worker_failure_names_worker_and_step(ray_local, tiny_model, tmp_path, hook, worker, step, monkeypatch):
    from digenrl.runtime import WorkerFailure
    from reference import reference_run

    from digenrl.runtime.driver import run_training

    run = tmp_path / "run"
    cfg = make_cfg(tiny_model, run, "runtime.mode=gap_tsp", "steps=4", "runtime.checkpoint_every=1",
                   "runtime.max_restarts=0")
    monkeypatch.setenv("DIGENRL_TEST_HOOKS", f"inject_failure={hook}")
    with pytest.raises(WorkerFailure) as err:
        run_training(cfg, ray=True)
    e = err.value
    assert (e.worker, e.step) == (worker, step)  # numbered from 1, as the progress line
    assert str(e).startswith(f"worker {worker} failed at step {step} during ")
    assert ":exit" in hook or f"injected failure of {worker} at step {step} (" in str(e)  # (exit: the actor died)
    rec = json.loads((run / "failure.json").read_text())
    assert (rec["worker"], rec["step"]) == (worker, step)
    from digenrl.train.checkpoint import latest_checkpoint, read_train_state

    path = latest_checkpoint(run)
    if step == 2:
        assert path is None or read_train_state(path).step <= 1
        return
    state = read_train_state(path)
    assert 1 <= state.step == state.version < step  # a committed step; the failed step never committed
    monkeypatch.delenv("DIGENRL_TEST_HOOKS")
    ref, _, _ = reference_run(cfg.model_copy(update={"steps": state.step}))  # the checkpoint: the reference's
    for k, v in ref.items():
        assert float((state.model[k] - v).norm() / v.norm().clamp_min(1e-12)) < 1e-5, k


def test_cli_worker_failure_exits_1_with_message(ray_local, tiny_model, tmp_path, capsys, monkeypatch):
    from digenrl.cli import main

    monkeypatch.setenv("DIGENRL_TEST_HOOKS", "inject_failure=gen0@2")
    run = tmp_path / "run"
    rc = main(["train", f"model.path={tiny_model}", f"run_dir={run}", "runtime.mode=gap", "steps=3",
               "train.prompts_per_step=2", "train.generations=4", "sampler.num_steps=4", "eval.every=0",
               "eval.num_prompts=2", "log.progress=false", "runtime.max_restarts=0"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "run failed: worker gen0 failed at step 2 during generate s2 " in err, err


def test_full_mode_recovers_a_killed_generator_within_the_tcss_bounds(ray_local, tiny_model, tmp_path, monkeypatch):
    """``full`` (TCSS) after a generator dies mid-run: the run restarts from the newest checkpoint and finishes,
    and the replayed steps keep every TCSS bound (the audit: staleness <= 1, stale share <= cap, one version per
    fragment, I2-I4). What it does not promise: the uninterrupted run's parameters, since which fragments run
    stale depends on timing (docs/reliability.md; measured in benchmarks/results/recovery_demo.json,
    ``full_mode``)."""
    from digenrl.runtime.driver import run_training

    run = tmp_path / "run"
    cfg = make_cfg(tiny_model, run, "runtime.mode=full", "steps=4", "runtime.max_stale_fraction=0.5",
                   "runtime.checkpoint_every=1")
    monkeypatch.setenv("DIGENRL_TEST_HOOKS", "inject_failure=gen0@3:exit")
    summary = run_training(cfg, ray=True)
    assert summary["restarts"] == 1 and summary["version"] == 4 and summary["audit_violations"] == []
    rec = summary["recoveries"][0]
    assert (rec["worker"], rec["step"]) == ("gen0", 3) and rec["replay_from_step"] <= 3
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if "reward_mean" in x]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # each step logged once
    assert all(r["stale_fraction"] <= 0.5 for r in rows)
