"""eval.guard (observe.hacking_guard): the trip rule on fake metric sequences, each action, the config checks,
and tiny demo runs that write the guard metrics, the figure, TensorBoard scalars and stop with exit code 3."""

import json
from types import SimpleNamespace

import pytest
import torch

from digenrl.cli import main
from digenrl.config import ConfigError, load_config
from digenrl.observe.hacking_guard import (EXIT_GUARD, PRE_DIVERGENCE, GuardMonitor, falls, parse_guard, tripped)

SHORT = ["steps=2", "train.prompts_per_step=2", "train.generations=4", "sampler.num_steps=4", "eval.num_prompts=4",
         "eval.grid_prompts=4", "eval.every=1", "log.progress=false"]


# ---- the rule --------------------------------------------------------------------------------------------
def test_falls_relative_and_absolute_near_zero():
    assert not falls(1.0, 0.91, 0.1) and falls(1.0, 0.89, 0.1)  # relative to |first|
    assert falls(-2.0, -2.3, 0.1) and not falls(-2.0, -2.1, 0.1)  # a negative reward falls further negative
    assert falls(0.0, -0.2, 0.1) and not falls(0.0, -0.05, 0.1)  # first ~ 0: absolute


def test_tripped_only_while_the_eval_reward_rises():
    tol = {"aesthetic": 0.1, "drift": 0.1}
    first = {"aesthetic": 5.0, "drift": 1.0}
    assert tripped(first, {"aesthetic": 4.0, "drift": 0.95}, 0.2, 0.6, tol) == ["aesthetic"]
    assert tripped(first, {"aesthetic": 4.0, "drift": 0.85}, 0.2, 0.6, tol) == ["aesthetic", "drift"]
    assert tripped(first, {"aesthetic": 4.0, "drift": 0.5}, 0.2, 0.2, tol) == []  # eval reward did not rise
    assert tripped(first, {"aesthetic": 4.0, "drift": 0.5}, 0.2, 0.1, tol) == []  # both fall: not hacking
    assert tripped(first, {"aesthetic": 6.0, "drift": 1.0}, 0.2, 0.9, tol) == []  # both rise


class FakeReward:
    """Scores each eval with the next value of a sequence (the guard's metric over the run)."""

    def __init__(self, seq):
        self.seq = list(seq)

    def score(self, images, prompts):
        v = torch.full((len(images),), float(self.seq.pop(0)), dtype=torch.float64)
        return v, {"judge": v}


def monitor(tmp_path, action, seq, tol=0.1):
    cfg = SimpleNamespace(eval=SimpleNamespace(guard={"judge": {}}, guard_action=action, guard_tolerance=tol))
    spec = SimpleNamespace(rewards=[SimpleNamespace(name="judge")], drift=None, tolerance={"judge": tol},
                           names=["judge"])
    return GuardMonitor(cfg, tmp_path, spec=spec, rewards=FakeReward(seq))


def run_sequence(m, evals, weights=None):
    batch = SimpleNamespace(images=torch.zeros(2, 3, 4, 4), prompts=[None, None])
    out = []
    for step, e in enumerate(evals):
        m.measure(step, batch)
        out.append(m.check(step, evals[0], e, weights=None if weights is None else (lambda s=step: weights(s))))
    return out


def test_warn_on_a_guard_falling_while_the_reward_rises(tmp_path, capsys):
    m = monitor(tmp_path, "warn", [1.0, 0.95, 0.8, 0.7])
    assert run_sequence(m, [0.2, 0.4, 0.6, 0.8]) == [[], [], ["judge"], ["judge"]]
    err = capsys.readouterr().err
    assert err.count("warning: eval.guard: guard/judge fell 20%") == 1  # once, when it starts to be tripped
    assert "at step 2 while the eval reward rose (0.2 -> 0.6)" in err
    assert m.stop is None
    s = m.summary()
    assert s["guard"]["judge"] == {"initial": 1.0, "final": 0.7, "min": 0.7}
    assert [t["step"] for t in s["guard_tripped"]] == [2, 3]


def test_both_rising_does_nothing(tmp_path, capsys):
    m = monitor(tmp_path, "stop", [1.0, 1.1, 1.3])
    assert run_sequence(m, [0.2, 0.4, 0.6]) == [[], [], []]
    assert m.stop is None and capsys.readouterr().err == ""


def test_stop_names_the_guard(tmp_path, capsys):
    m = monitor(tmp_path, "stop", [2.0, 1.5, 1.0])
    run_sequence(m, [0.1, 0.5, 0.9])
    assert m.stop["guard"] == "judge" and m.stop["step"] == 1 and m.stop["value"] == 1.5
    assert "the run ends after this step" in capsys.readouterr().err


def test_none_only_records(tmp_path, capsys):
    m = monitor(tmp_path, "none", [1.0, 0.5])
    assert run_sequence(m, [0.1, 0.5]) == [[], ["judge"]]
    assert capsys.readouterr().err == "" and m.stop is None and len(m.trips) == 1


def test_checkpoint_keeps_the_last_eval_before_the_trip(tmp_path):
    m = monitor(tmp_path, "checkpoint", [1.0, 0.98, 0.97, 0.5, 0.4, 1.0])
    run_sequence(m, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], weights=lambda s: f"weights of step {s}".encode())
    assert (tmp_path / PRE_DIVERGENCE).read_bytes() == b"weights of step 2"  # not rewritten after the trip
    assert m.tripped_at == 3 and m.stop is None


def test_state_round_trip(tmp_path):
    m = monitor(tmp_path, "warn", [1.0, 0.5, 0.4])
    run_sequence(m, [0.1, 0.5])
    m2 = monitor(tmp_path, "warn", [0.4])
    m2.restore(json.loads(json.dumps(m.state())))
    assert m2.first == m.first and m2.history == m.history and m2.active == {"judge"} and m2.tripped_at == 1


# ---- config --------------------------------------------------------------------------------------------
def test_parse_guard_names_the_key():
    spec = parse_guard({"digits": {}, "drift": {"patch": 4, "tolerance": 0.05}}, 0.1)
    assert spec.names == ["digits", "drift"] and spec.tolerance == {"digits": 0.1, "drift": 0.05}
    with pytest.raises(ValueError, match=r"eval\.guard\.digits\.weight"):
        parse_guard({"digits": {"weight": 1.0}}, 0.1)
    with pytest.raises(ValueError, match=r"eval\.guard\.drift\.bogus: unknown option"):
        parse_guard({"drift": {"bogus": 1}}, 0.1)
    with pytest.raises(ValueError, match=r"eval\.guard\.nosuch"):
        parse_guard({"nosuch": {}}, 0.1)
    with pytest.raises(ValueError, match=r"eval\.guard\.drift\.tolerance"):
        parse_guard({"drift": {"tolerance": -1}}, 0.1)


def test_guard_config_shorthand_in_every_mode():
    cfg = load_config(None, ["eval.guard={drift: null}"])
    assert cfg.eval.guard == {"drift": {}} and cfg.eval.guard_action == "warn" and cfg.eval.guard_tolerance == 0.1
    for mode in (["runtime.mode=gap_tsp"], ["runtime.trainers=2"]):  # (a Ray run: tests/runtime/test_guard_ray.py)
        assert load_config(None, ["eval.guard={drift: null}", *mode]).eval.guard == {"drift": {}}
    with pytest.raises(ConfigError, match="eval.guard_action"):
        load_config(None, ["eval.guard_action=explode"])


def test_bad_guard_exits_2_and_writes_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", *SHORT, "eval.guard={nosuch: {}}"]) == 2
    assert "eval.guard.nosuch" in capsys.readouterr().err and not run.exists()


# ---- demo runs -------------------------------------------------------------------------------------------
def test_demo_run_writes_guard_metrics_figure_and_tensorboard(tmp_path):
    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", *SHORT, "log.tensorboard=true", "eval.guard_action=checkpoint",
                 "eval.guard={jpeg_compressibility: null, drift: {patch: 4}}"]) == 0
    from digenrl.models.tiny_dit import TinyDiTPolicy

    TinyDiTPolicy.load(run / PRE_DIVERGENCE)  # the weights of the last eval before a trip (none here: the last)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval_reward" in r]
    assert [r["step"] for r in evals] == [0, 1, 2]  # before, every=1, final
    for r in evals:
        for key in ["guard/jpeg_compressibility", "guard/drift", "guard/drift/hist", "guard/drift/saturation",
                    "guard/drift/uniformity"]:
            assert isinstance(r[key], float), key
    assert evals[0]["guard/drift"] == 1.0 and evals[0]["guard/drift/hist"] == 0.0  # base vs itself
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary["guard"]) == {"jpeg_compressibility", "drift"} and summary["guard"]["drift"]["initial"] == 1.0
    assert (run / "reward_curve.png").stat().st_size > 0
    from digenrl.observe.plots import reward_curve

    labels = reward_curve(rows, tmp_path / "again.png")["labels"]
    assert "guard/drift (eval, not optimised)" in labels and "guard/jpeg_compressibility (eval, not optimised)" in labels
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    assert len(acc.Scalars("guard/drift")) == 3


def test_demo_run_stops_on_the_guard(tmp_path, monkeypatch, capsys):
    import digenrl.train.evaluate as evaluation

    real, calls = evaluation.evaluate, []

    def rising(*a, **k):  # the trained eval reward rises by 1 per eval; the samples are the real ones
        r, batch = real(*a, **k)
        calls.append(1)
        return r + len(calls), batch

    monkeypatch.setattr(evaluation, "evaluate", rising)  # (the worker imports it when it evaluates)
    run = tmp_path / "run"
    rc = main(["train", f"run_dir={run}", *SHORT, "steps=3", "eval.guard={drift: {tolerance: 1.0e-9}}",
               "eval.guard_action=stop"])
    err = capsys.readouterr().err
    assert rc == EXIT_GUARD == 3
    assert "run stopped by eval.guard after step 1 of 3: guard/drift" in err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["guard_stop"]["guard"] == "drift" and summary["steps_done"] == 1
    assert summary["audit_violations"] == [] and summary["version"] == 1  # the steps it did, audited
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in rows) == 1 and rows[-1]["final"]
    assert (run / "checkpoints").is_dir() and (run / "checkpoint.safetensors").is_file()
    assert len(calls) == 2  # before, step 1 (its eval is the final one)


def test_resumed_run_keeps_the_base_statistics(tmp_path):
    run = tmp_path / "run"
    guard = ["eval.guard={drift: {patch: 4}}", "runtime.checkpoint_every=1"]
    assert main(["train", f"run_dir={run}", *SHORT, *guard]) == 0
    first = json.loads((run / "summary.json").read_text())["guard"]["drift"]
    assert main(["train", "--resume", str(run), "steps=3"]) == 0
    summary = json.loads((run / "summary.json").read_text())["guard"]["drift"]
    assert summary["initial"] == 1.0  # the base samples' statistics came back from the checkpoint
    assert summary["min"] <= first["min"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "guard/drift" in r] == [0, 1, 3]  # the first final eval (2) was dropped


def test_guard_added_on_resume_warns(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", *SHORT, "runtime.checkpoint_every=1"]) == 0
    assert main(["train", "--resume", str(run), "steps=3", "eval.guard={drift: null}"]) == 0
    assert "the checkpoint holds no guard state" in capsys.readouterr().err
