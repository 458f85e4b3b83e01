"""Every controller wait has a deadline (issue 22, item 4): start-up, each calibration measurement, the final
eval and checkpoint go through ``get_named`` with a deadline from the configured bounds (``runtime.watchdog_s``,
else a documented default), so a stalled worker becomes a ``WorkerFailure`` naming it (recovery, or a clear
error) instead of a silent hang; and the watchdog of an action that scores a remote reward adds the reward
client's own retry window, so a reward-service outage inside that window pauses the run instead of
restarting the generator."""

from __future__ import annotations

import time

import pytest

from runtime_helpers import make_cfg


def _actors(ray, stall_gen: bool):
    """A generator and a trainer rank stand-in (defined here: Ray pickles it by value, test modules do not
    import on its workers)."""

    class _Worker:
        def __init__(self, stall: bool = False):
            self.stall = stall

        def ping(self) -> int:
            return 0

        def calibration_start(self, gen_sizes, cell_sizes):
            return [[("generate", 1, p) for p in ("sample", "decode", "reward", "transfer")]] if gen_sizes else \
                [[("train", 1)], [("optimizer",), ("publish",)]]

        def calibration_run(self, key):
            if self.stall and key == ("generate", 1, "decode"):
                time.sleep(3600)  # a hung generator, in the middle of its calibration: alive, never answers
            return 0.01

        def calibration_end(self):
            return True

        def abort(self):
            if self.stall:
                time.sleep(3600)  # a stopped worker never answers
            return None

    cls = ray.remote(num_cpus=0)(_Worker)
    gen, trn = cls.remote(stall_gen), cls.remote(False)
    ray.get([gen.ping.remote(), trn.ping.remote()], timeout=120)  # both started (a process each) before timing
    return gen, trn


def test_get_named_gives_up_at_its_deadline(ray_local):
    from digenrl.runtime.cluster import ActorPools
    from digenrl.runtime.errors import WorkerFailure

    gen, trn = _actors(ray_local, True)
    get_named = ActorPools({"gen0": gen}, {"trn0": trn}).get_named
    try:
        t0 = time.monotonic()
        with pytest.raises(WorkerFailure) as e:
            get_named({"trn0": trn.ping.remote(), "gen0": gen.calibration_run.remote(("generate", 1, "decode"))},
                      "profiling", timeout_s=1.0)  # fmt: skip
        assert time.monotonic() - t0 < 30
        assert e.value.worker == "gen0" and "stalled" in str(e.value) and "1 s" in str(e.value)
        assert get_named({"trn0": trn.ping.remote()}, "ping", timeout_s=30.0) == [0]
    finally:
        ray_local.kill(gen)
        ray_local.kill(trn)


@pytest.mark.parametrize("repeats", [1, 6])
def test_a_generator_stalled_during_calibration_is_caught(ray_local, tiny_model, tmp_path, repeats):
    """Each calibration call times one execution of one op: the stall is a WorkerFailure naming the generator
    within CALIBRATION_FACTOR x runtime.watchdog_s of the call it stopped in, whatever the repeats (the old
    single call had repeats x ops watchdogs)."""
    from digenrl.control.run_plan import plan_run
    from digenrl.runtime.calibrate import calibrate
    from digenrl.runtime.cluster import ActorPools
    from digenrl.runtime.deadlines import CALIBRATION_FACTOR
    from digenrl.runtime.errors import WorkerFailure

    w = 1.0
    run = plan_run(make_cfg(tiny_model, tmp_path, "runtime.mode=gap_tsp_tag", f"runtime.watchdog_s={w}"))
    gen, trn = _actors(ray_local, True)
    pools = ActorPools({"gen0": gen}, {"trn0": trn})
    try:
        t0 = time.monotonic()
        with pytest.raises(WorkerFailure) as e:
            calibrate(run, pools, repeats=repeats, gen_sizes=[1, 2, 4], cell_sizes=[1, 2, 4, 8])
        assert e.value.worker == "gen0" and "stalled" in str(e.value) and f"{CALIBRATION_FACTOR * w:g} s" in str(e.value)
        # noticed within the bound of one call (+ the round trips of the calls before it, and a loaded machine)
        assert time.monotonic() - t0 < CALIBRATION_FACTOR * w + 20
    finally:
        ray_local.kill(gen)
        ray_local.kill(trn)


def test_call_deadlines_follow_the_configured_bounds(tmp_path):
    """With runtime.watchdog_s = w every phase's deadline is a fixed multiple of w (none grows with the work's
    size); without it, the documented defaults."""
    from digenrl.runtime import deadlines as dl

    cfg = make_cfg("m.safetensors", tmp_path)
    assert dl.call_deadline(cfg) == dl.DEFAULT_CALL_S
    assert dl.startup_deadline(cfg) == dl.DEFAULT_STARTUP_S
    assert dl.calibration_deadline(cfg) == dl.DEFAULT_OP_S
    cfg = make_cfg("m.safetensors", tmp_path, "runtime.watchdog_s=20")
    assert dl.calibration_deadline(cfg) == 40.0
    assert dl.call_deadline(cfg) == 200.0
    assert dl.startup_deadline(cfg) == 600.0  # 30 w: a bounded multiple, not the 1800 s floor of before


class _FlatCost:
    def time(self, op: str, batch: int, pool: str) -> float:
        return 0.01


def test_watchdog_of_a_generate_adds_the_remote_reward_window(tiny_model, tmp_path):
    from digenrl.control.run_plan import plan_run
    from digenrl.runtime.deadlines import watchdog as _watchdog
    from digenrl.schedule.actions import Generate
    from digenrl.schedule.scheduler import Scheduler

    remote = "reward={remote: {url: 'http://127.0.0.1:1', weight: 1, retry_window: 300, timeout: 20}}"
    for extra, cost in (([], _FlatCost()), (["runtime.watchdog_s=30"], None)):
        plain = plan_run(make_cfg(tiny_model, tmp_path, "runtime.mode=gap_tsp", *extra))
        served = plan_run(make_cfg(tiny_model, tmp_path, "runtime.mode=gap_tsp", remote, *extra))
        gen = next(a for a in Scheduler(plain.plan).start(0.0) if isinstance(a, Generate))
        base, with_window = _watchdog(plain, cost)(gen), _watchdog(served, cost)(gen)
        assert base == (30.0 if extra else pytest.approx(60.0 + 20.0 * 0.01 * (4 + 3)))  # T=4 denoise + 3 ops
        # the client's own window, then one more request: a service outage inside it pauses, not restarts
        assert with_window == pytest.approx(base + 300 + 20)
        from digenrl.runtime.deadlines import call_deadline

        # side calls (an eval, a checkpoint between steps): the call deadline, in every mode
        assert _watchdog(plain, cost)(None) == call_deadline(plain.cfg)
        assert _watchdog(served, cost)(None) == call_deadline(served.cfg) + 320
    no_bound = plan_run(make_cfg(tiny_model, tmp_path, "runtime.mode=gap_tsp", remote))
    # no bound configured nor modelled: the observed action times (none yet: DEFAULT_OP_S), plus the window
    from digenrl.runtime.deadlines import DEFAULT_OP_S

    assert _watchdog(no_bound, None)(gen) == DEFAULT_OP_S + 320
    assert _watchdog(no_bound, None)(None) == call_deadline(no_bound.cfg) + 320


def test_observed_costs_bound_an_action_by_its_kind(tiny_model, tmp_path):
    from digenrl.control.run_plan import plan_run
    from digenrl.runtime import deadlines as dl
    from digenrl.schedule.actions import Generate
    from digenrl.schedule.scheduler import Scheduler

    plan = plan_run(make_cfg(tiny_model, tmp_path, "runtime.mode=gap_tsp")).plan
    gen = next(a for a in Scheduler(plan).start(0.0) if isinstance(a, Generate))
    obs = dl.ObservedCosts()
    assert obs.deadline(gen) == dl.DEFAULT_OP_S  # nothing of its kind completed yet
    obs.observe(gen, 0.5 * len(gen.fragment.generations))
    obs.observe(gen, 0.1 * len(gen.fragment.generations))  # the slowest per generation counts
    assert obs.deadline(gen) == pytest.approx(dl.OBSERVED_FLOOR_S + dl.OBSERVED_FACTOR * 0.5 * len(gen.fragment.generations))


def _wake_stopped_children() -> int:
    """SIGCONT this process's stopped descendants (Ray's workers): ends the old code's hang."""
    import signal

    import psutil

    woken = 0
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_STOPPED:
                p.send_signal(signal.SIGCONT)
                woken += 1
        except psutil.Error:
            pass
    return woken


def test_a_stopped_generator_in_gap_tsp_with_defaults_is_recovered(ray_local, tiny_model, tmp_path, monkeypatch):
    """gap_tsp with no runtime.watchdog_s and no cost model: the generator SIGSTOPs itself at step 2; the
    watchdog from the run's observed times (floor lowered to keep the test short) catches it and the run
    recovers. The old code had no deadline: the run waits until the test wakes the worker, and fails."""
    import threading

    from digenrl.runtime import deadlines as dl
    from digenrl.runtime.driver import run_training

    monkeypatch.setattr(dl, "OBSERVED_FLOOR_S", 3.0, raising=False)  # (absent in the old code)
    cfg = make_cfg(tiny_model, tmp_path / "run", "runtime.mode=gap_tsp", "steps=2")
    monkeypatch.setenv("DIGENRL_TEST_HOOKS", "inject_failure=gen0@2:stall")
    assert cfg.runtime.watchdog_s is None and cfg.runtime.profile is None
    out: dict = {}

    def go():
        try:
            out["summary"] = run_training(cfg, ray=True)
        except BaseException as e:  # noqa: BLE001 -- re-raised in the test's thread
            out["error"] = e

    t0 = time.monotonic()
    th = threading.Thread(target=go, daemon=True)
    th.start()
    th.join(240)  # a caught stall ends the run early; 240 s leaves room for a loaded machine (60 s did not
    hung = th.is_alive()  # at a 1-min load of 8: the recovery itself then takes over a minute)
    if hung:
        _wake_stopped_children()
        th.join(120)
    assert not hung, f"no deadline: the stopped generator was not caught in {time.monotonic() - t0:.0f} s"
    if "error" in out:
        raise out["error"]
    rec = out["summary"]["recoveries"]
    assert out["summary"]["version"] == 2 and rec and rec[0]["worker"] == "gen0" and "stalled" in rec[0]["cause"]


def test_recovery_waits_for_no_call_to_the_old_workers(ray_local, tiny_model, tmp_path):
    """After a stall is noticed the attempt is abandoned without asking the old actors anything (they are
    killed next): an abort call to a stopped trainer rank waited out its 30 s before every restart (the recovery
    of a trainer rank stopped in a stream publish took 38 s after it was noticed)."""
    from types import SimpleNamespace

    from digenrl.runtime.clocks import Clock
    from digenrl.runtime.cluster import ActorPools
    from digenrl.runtime.driver import _Controller
    from digenrl.runtime.errors import WorkerFailure

    stopped, other = _actors(ray_local, True)  # ``stopped`` never answers an abort
    ctl = object.__new__(_Controller)
    ctl.cfg, ctl.clock, ctl.sched, ctl.stats, ctl.recoveries = make_cfg(tiny_model, tmp_path), Clock(), None, [], []
    ctl.out, ctl._attempt_start = SimpleNamespace(run_dir=tmp_path), 0.0
    ctl.pools = ActorPools({}, {"trn0": other, "trn1": stopped})
    try:
        t0 = time.monotonic()
        ctl._recover(WorkerFailure("trn1", 2, "publish of version 2", "no answer within 20 s: the worker is stalled"))
        assert time.monotonic() - t0 < 10  # (the old abort: 30 s for the stopped rank)
        assert ctl.first == 0 and ctl.recoveries[0]["worker"] == "trn1"
    finally:
        ray_local.kill(stopped)
        ray_local.kill(other)
