"""The plan search's pruning: the step-time floor is never above the simulated figure, the pruned search returns
what the exhaustive one does, and an optimistic floor would be caught; the same for the pick at a run's length
(``run_steps``: the run floor, the lean run, the final pick)."""

import itertools
import json
import random
from dataclasses import replace

from digenrl.config import load_config
from digenrl.control.profile import load_profile
from digenrl.schedule import Mode, StepPlan
from digenrl.sim import planner
from digenrl.sim.config_source import ConfigSource
from digenrl.sim.executor import run_step_time, simulate, steady_step_time
from digenrl.sim.plan_bound import first_publish_floor, run_step_floor, step_time_floor
from digenrl.sim.planner import search
from digenrl.sim.robustness import robustness, scaled

OPS = {"denoise": [[1, 0.004], [4, 0.010]], "vae_decode": [[1, 0.001]], "reward": [[1, 0.0005]],
       "transfer": [[1, 0.0001]], "train_chunk": [[1, 0.006], [8, 0.03]], "allreduce": [[1, 0.004]],
       "optimizer": [[1, 0.003]], "publish": [[1, 0.002]], "tag_switch": [[1, 0.001]]}
TINY = ["steps=6", "train.prompts_per_step=3", "train.generations=4", "sampler.num_steps=4",
        "train.timestep_fraction=0.5", "runtime.generators=2", "runtime.trainers=1"]


def _profile(tmp_path, trainers, ops=OPS):
    p = tmp_path / f"p{trainers}-{len(ops)}.json"
    p.write_text(json.dumps({"format": "digenrl-profile", "version": 1, "source": "hand-made", "ops": ops,
                             "trainers": trainers}))
    return load_profile(p)


# a publish whose two sides differ (a stream: the trainers' send is short, the generators' receive long)
SPLIT_PUBLISH = {**{k: v for k, v in OPS.items() if k != "publish"}, "trainer/publish": [[1, 0.0005]],
                 "generator/publish": [[1, 0.02]]}


def _plans():
    """Small plans of every mode, pool split, fragment and chunk shape, minibatch count, publish path."""
    rng = random.Random(7)
    grid = list(itertools.product(list(Mode), [(1, 2), (2, 1), (2, 2), (1, 3)], [1, 2, 4], [(1, 1), (2, 2), (4, 2)],
                                  [(1, 1), (3, 1), (1, 2)], ["object_store", "broadcast", "stream"], [False, True]))
    for mode, (g, t), f, (cg, cs), (mb, ep), path, wide in rng.sample(grid, 200):
        gens = () if mode is Mode.COLOCATED else tuple(f"g{i}" for i in range(g))
        yield StepPlan(3, 4, f, 2, 4, cg, cs, gens, tuple(f"t{i}" for i in range(t)), mode, 4,
                       0.5 if mode is Mode.FULL else 0.0, minibatches=mb, epochs=ep,
                       publish_joins=path != "object_store" and mode.disaggregated, step_wide=wide,
                       publish_streams=path == "stream" and mode.disaggregated)


def test_steady_step_time_is_the_simulated_figure(tmp_path):
    """The probes' lean run gives the full simulation's float; capped at a figure (``above``) it gives it too
    when the figure is not above the cap, and None (stopped) when it is."""
    cost = _profile(tmp_path, 2)
    for plan in list(_plans())[:40]:
        want = simulate(plan, cost, record=False).timing()["steady_step_time_s"]
        assert steady_step_time(plan, cost) == want
        assert steady_step_time(plan, cost, above=want) == want
        assert steady_step_time(plan, cost, above=want * 1.01) == want
        assert steady_step_time(plan, cost, above=want * 0.999) is None


def test_the_floor_is_never_above_the_simulated_step_time(tmp_path):
    """Every plan of the grid, with rollout or training made the bottleneck (x 0.2 / x 5): the floor is at most
    the full simulation's steady step time, and close to it where one pool's work decides."""
    base = _profile(tmp_path, 2)
    split = _profile(tmp_path, 2, SPLIT_PUBLISH)
    ratios = []
    for plan in _plans():
        for cost in (base, scaled(base, 5.0, 0.2), scaled(base, 0.2, 5.0), split):
            sim = simulate(plan, cost, record=False).timing()["steady_step_time_s"]
            floor = step_time_floor(plan, cost)
            assert 0.0 < floor <= sim, (plan, floor, sim)
            ratios.append(floor / sim)
    assert max(ratios) > 0.95  # tight where a pool's work alone decides (so the pruning has teeth)


def test_run_step_time_is_the_simulated_figure(tmp_path):
    """The final pick's lean run gives the full simulation's makespan / K; capped, None only when it is above."""
    cost = _profile(tmp_path, 2)
    for plan in list(_plans())[:40]:
        want = simulate(plan, cost, record=False).step_time
        assert run_step_time(plan, cost) == want
        assert run_step_time(plan, cost, above=want) == want
        assert run_step_time(plan, cost, above=want * 0.999) is None


def test_the_run_floor_is_never_above_the_run_figure(tmp_path):
    """Every plan of the grid and cost skew: the first-publish floor is at most the simulated first publish, and
    the run floor at most makespan / K, at the plan's steps and at more."""
    base = _profile(tmp_path, 2)
    split = _profile(tmp_path, 2, SPLIT_PUBLISH)
    ratios = []
    for plan in _plans():
        for cost in (base, scaled(base, 5.0, 0.2), scaled(base, 0.2, 5.0), split):
            for p in (plan, replace(plan, steps=7)):
                run = simulate(p, cost, record=False)
                assert 0.0 < first_publish_floor(p, cost) <= run.stats[0].published, (p, cost)
                floor = run_step_floor(p, cost)
                assert 0.0 < floor <= run.step_time, (p, floor, run.step_time)
                ratios.append(floor / run.step_time)
    assert max(ratios) > 0.95


def test_scaled_skews_rollout_against_training(tmp_path):
    """``robustness.scaled`` (the robustness report's skew): denoise, VAE, reward, transfer and the TAG switch x gen on
    either pool; train, commit (all-reduce, optimizer) and publish x train."""
    base = _profile(tmp_path, 2)
    skewed = scaled(base, 3.0, 0.5)
    for op in OPS:
        for pool in ("generator", "trainer"):
            f = 3.0 if op in ("denoise", "vae_decode", "reward", "transfer", "tag_switch") else 0.5
            assert skewed.time(op, 1, pool) == base.time(op, 1, pool) * f, (op, pool)


def _both(cfg, workers, cost, trainers, **kw):
    src = ConfigSource(cfg, workers, profile=cost, profile_trainers=trainers)
    a = search(src, probe_steps=4, prune=False, **kw)
    b = search(src, probe_steps=4, prune=True, **kw)
    return a, b


def _summary(res):
    return res.best.candidate, res.best.step_time, res.per_split(), robustness(res, 4)


CASES = [("gap_tsp", 2, {}), ("gap_tsp_tag", 2, {}), ("full", 2, {}), ("gap", 2, {}),
         ("gap_tsp_tag", 2, {"exhaustive": 1, "descend_splits": 1}), ("full", 2, {"exhaustive": 1}),
         ("colocated", 3, {})]
SKEWS = [(1.0, 1.0), (4.0, 1.0), (1.0, 4.0)]


def _case_runs(tmp_path):
    for (mode, trainers, kw), (gf, tf) in itertools.product(CASES, SKEWS):
        pools = ["runtime.generators=1", "runtime.trainers=3"] if mode == "colocated" else []
        cfg = load_config(None, TINY + [f"runtime.mode={mode}"] + pools)
        yield (mode, kw, gf, tf), _both(cfg, 3, scaled(_profile(tmp_path, trainers), gf, tf), trainers, **kw)


def test_pruned_search_returns_the_exhaustive_result(tmp_path):
    """Plan, step time, every split's best and the robustness report are those of prune=False (which simulates
    every candidate), in both search regimes; the pruning skips candidates in the set as a whole."""
    skipped = 0
    for key, (full, pruned) in _case_runs(tmp_path):
        assert _summary(pruned) == _summary(full), key
        assert full.pruned == 0 and len(pruned.probes) <= len(full.probes), key
        skipped += pruned.pruned
    assert skipped > 20


def test_an_optimistic_floor_would_be_caught(tmp_path, monkeypatch):
    """The comparison above has teeth: a floor 30 % above the true one (so it prunes candidates that win)
    changes the result of at least one case."""
    monkeypatch.setattr(planner, "step_time_floor", lambda plan, cost, **kw: 1.3 * step_time_floor(plan, cost, **kw))
    assert any(_summary(pruned) != _summary(full) for _, (full, pruned) in _case_runs(tmp_path))


def _run_summary(res):
    return res.best.candidate, res.best.step_time, res.runs_s[res.best.candidate], res.holds_s


def test_pruned_search_at_the_run_length_returns_the_exhaustive_pick(tmp_path):
    """With ``run_steps``: the pick, its probe, its run figure and the stale holds are those of prune=False, whose
    final pick simulates every candidate looked at; the pick's run is the least of them (ties: the earlier)."""
    skipped = 0
    for (mode, trainers, kw), (gf, tf) in itertools.product(CASES, SKEWS):
        pools = ["runtime.generators=1", "runtime.trainers=3"] if mode == "colocated" else []
        cfg = load_config(None, TINY + [f"runtime.mode={mode}"] + pools)
        full, pruned = _both(cfg, 3, scaled(_profile(tmp_path, trainers), gf, tf), trainers, run_steps=9, **kw)
        assert _run_summary(pruned) == _run_summary(full), (mode, kw, gf, tf)
        assert full.runs_s[full.best.candidate] == min(full.runs_s.values())
        assert len(full.runs_s) >= len(full.probes) and full.runs_skipped == 0
        skipped += pruned.runs_skipped
    assert skipped > 20


def test_an_optimistic_run_floor_would_be_caught(tmp_path, monkeypatch):
    """The comparison above has teeth: a run floor 30 % above the true one changes the pick of at least one case."""
    monkeypatch.setattr(planner, "run_step_floor", lambda plan, cost, **kw: 1.3 * run_step_floor(plan, cost, **kw))
    differs = False
    for (mode, trainers, kw), (gf, tf) in itertools.product(CASES, SKEWS):
        pools = ["runtime.generators=1", "runtime.trainers=3"] if mode == "colocated" else []
        cfg = load_config(None, TINY + [f"runtime.mode={mode}"] + pools)
        full, pruned = _both(cfg, 3, scaled(_profile(tmp_path, trainers), gf, tf), trainers, run_steps=9, **kw)
        differs = differs or _run_summary(pruned)[:3] != _run_summary(full)[:3]
    assert differs


def test_progress_reports_probes_and_skipped_candidates(tmp_path, capsys, monkeypatch):
    """The search tells its progress after every probe and every skipped candidate; `digenrl plan` draws it as a
    live rich line on a terminal (stderr), naming both counts."""
    import io

    from digenrl.sim import plan_cli

    cfg = load_config(None, TINY + ["runtime.mode=gap_tsp"])
    calls = []
    res = search(ConfigSource(cfg, 3, profile=_profile(tmp_path, 2), profile_trainers=2), probe_steps=4,
                 progress=lambda *a: calls.append(a))
    assert res.pruned > 0 and calls[-1][0] == len(res.probes) and calls[-1][3] == res.pruned
    assert len(calls) == len(res.probes) + res.pruned
    assert [c[0] for c in calls] == sorted(c[0] for c in calls) and calls[-1][2] == res.best.step_time

    class _Tty(io.StringIO):
        def isatty(self):
            return True
    err = _Tty()
    monkeypatch.setattr("sys.stderr", err)
    prof = tmp_path / "p2.json"
    prof.write_text(json.dumps({"format": "digenrl-profile", "version": 1, "source": "hand-made", "ops": OPS,
                                "trainers": 2}))
    argv = ["--config", "default", "--profile", str(prof), "--out", str(tmp_path / "plan.yaml")]
    for kv in TINY + ["runtime.mode=gap_tsp"]:
        argv += ["--set", kv]
    assert plan_cli.main(argv) == 0
    assert "skipped by their floor" in err.getvalue() and "probes" in err.getvalue()
