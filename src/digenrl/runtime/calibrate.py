"""Driver-side calibration: a measured cost profile of the live workers of a run.

Every op of ``schedule.cost`` is timed inside the actors of the configured pools (``timing``), so threads,
placement and the Ray call overhead are those of a run; one generator and the trainer ranks measure at the
same time, as they work in a pipelined step (on a shared CPU node they slow each other down; on separate GPUs
it changes nothing). Each op gets one actor-call round trip added (``transfer``, ``train_chunk``, ``optimizer``,
``publish``); ``tag_switch`` = 0 (no inference copy to build without FSDP).

The dict is the ``digenrl-profile`` schema of ``digenrl.control.profile`` (``profile_dict``, written by
``save_profile``; ``simulate --profile`` reads it).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from digenrl.control.profile import ProfileCost, profile_dict, save_profile
from digenrl.schedule import classic_chunks, step_fragments, tsp_chunks
from digenrl.schedule.cost import GENERATOR, TRAINER

from .deadlines import calibration_deadline, call_deadline, remote_reward_wait
from .errors import WorkerFailure


def build_profile(gen: dict, trn_gen: dict, meas: dict, T: int, overhead_s: float, source: str,
                  pools: tuple[int, int]) -> dict:
    """The ``digenrl-profile`` JSON dict from the measurements (see the module docstring)."""

    def pts(d: dict, key: str, add: float = 0.0, div: float = 1.0) -> list:
        return [[int(n), max(0.0, v[key] / div + add)] for n, v in sorted(d.items())]

    ops = {}
    for pool, g in ((GENERATOR, gen or trn_gen), (TRAINER, trn_gen or gen)):
        ops[f"{pool}/denoise"] = pts(g, "sample", div=T)
        ops[f"{pool}/vae_decode"] = pts(g, "decode")
        ops[f"{pool}/reward"] = pts(g, "reward", add=overhead_s)  # the call returns after scoring
        ops[f"{pool}/transfer"] = pts(g, "transfer")
    ops["train_chunk"] = [[int(c), s + overhead_s] for c, s in sorted(meas["train"].items())]
    ops["allreduce"] = [[1, meas["allreduce"]]]
    ops["optimizer"] = [[1, meas["optimizer"] + overhead_s]]
    ops["publish"] = [[1, meas["publish"] + overhead_s]]
    ops["tag_switch"] = [[1, 0.0]]
    return profile_dict(ops, source, pools)


def sizes_upto(n: int) -> list[int]:
    out, k = [], 1
    while k < n:
        out.append(k)
        k *= 2
    return out + [n]


def plan_sizes(plan) -> tuple[list[int], list[int]]:
    """Generation sizes and chunk sizes (cells) a run of ``plan`` uses. Generation: its fragments and, in a
    ``packed`` colocated plan, a worker's share of the step's fragments in one action (``colocated_share``
    consecutive fragments of the dispatch order, as the scheduler takes them). Without the share the profile held
    the fragment size only and the simulator priced a batch of the share as that many fragments one after the
    other: +15-21% on colocated in ``benchmarks/pipeline_cpu.py`` (a batch of 32 runs faster than 8 of 4). A TAG
    gang on a shard group of R lanes takes up to R fragments (``layout.gang_size``): sizes m f for m = 1, 2, 4, ...,
    R, so that every gang lies between two timed sizes (a profile curve of one point is proportional through 0:
    a gang of R fragments was priced R times a fragment, though each lane samples only its share). With
    ``plan.sample_batch`` b, also the batches such an action is priced as: b and n mod b."""
    order = step_fragments(plan, 0)
    frags = {f.size for f in order}
    if plan.packed:
        n = plan.colocated_share
        frags |= {sum(f.size for f in order[i:i + n]) for i in range(0, len(order), n)}
    if plan.mode.tag and plan.shard_ranks > 1:
        frags |= {m * plan.fragment_size for m in sizes_upto(plan.shard_ranks)}
    if plan.sample_batch:  # an action of n is priced as its batches of at most b (``cost.fragment_seconds``)
        b = plan.sample_batch
        frags |= {k for n in frags for k in (min(n, b), n % b if n > b else 0) if k}
    chunks = {c.size for c in tsp_chunks(plan, 0, 0)} if plan.mode.tsp else {
        c.size for g in range(plan.prompts) for cs in classic_chunks(plan, 0, g).values() for c in cs}
    return sorted(frags), sorted(chunks)


def calibrate(run, pools, repeats: int = 2, gen_sizes: list[int] | None = None,
              cell_sizes: list[int] | None = None, trainer_generation: bool | None = None) -> dict:
    """Measure the ops on the live workers (one generator and every trainer rank at once). Each call times one
    execution of one op (``timing.Calibration``) under ``deadlines.calibration_deadline``, so a stalled worker
    is a ``WorkerFailure`` naming it within that, whatever the number of sizes and repeats."""
    plan = run.plan
    fs, cs = plan_sizes(plan)
    gen_sizes, cell_sizes = gen_sizes or fs, cell_sizes or cs
    rank0 = next(iter(pools.trainers))
    ping_s = call_deadline(run.cfg)
    per_call = calibration_deadline(run.cfg) + remote_reward_wait(run.cfg)  # a call may score (generation)
    pools.get_named({rank0: pools.call(rank0, "ping")}, "profiling", ping_s)
    pings = []
    for _ in range(7):
        t0 = time.perf_counter()
        pools.get_named({rank0: pools.call(rank0, "ping")}, "profiling", ping_s)
        pings.append(time.perf_counter() - t0)
    overhead = statistics.median(pings)
    if trainer_generation is None:
        trainer_generation = plan.mode.tag or not plan.mode.disaggregated
    first = run.ranks_of(plan.generators[0]) if plan.generators else ()  # (a sequence-parallel one: its ranks)
    streams = [_Stream(pools, first, gen_sizes, [], repeats, per_call)] if first else []
    streams.append(_Stream(pools, tuple(pools.trainers), gen_sizes if trainer_generation else [], cell_sizes,
                           repeats, per_call))
    echo = None
    if not pools.in_process:  # (in-process calls run one after the other: no round trip while they run)
        import ray

        echo = ray.remote(num_cpus=0)(_EchoActor).remote()  # started (a worker process), ready before any timing
        pools.get_named({"echo": echo.ping.remote()}, "profiling", ping_s)
    try:
        overhead = max(overhead, _run_streams(pools, streams, echo))
    finally:
        if echo is not None:
            ray.kill(echo)
    gen = streams[0].result()["generate"] if first else {}
    meas = streams[-1].result()
    source = (f"digenrl runtime profile: {run.cfg.model.kind}, {rank0} + {len(pools.generators)} generators, "
              f"{run.cfg.runtime.threads_per_worker} threads/worker, {time.strftime('%Y-%m-%d %H:%M')}")
    return build_profile(gen, meas["generate"], meas, plan.sampling_steps, overhead, source,
                         (len(pools.generators), len(pools.trainers)))


class _Stream:
    """One pool's part of the calibration: ``calibration_start``, then one ``calibration_run`` per timed
    execution (each block of ops: its keys once as a warm-up, then ``repeats`` rounds over them), then
    ``calibration_end``. Every worker of the pool (the trainer ranks: a sharded or sequence-parallel pool's are
    collectives; a sequence-parallel generator's ranks) gets each call at once, through ``pools.call``; a call
    that has not answered within ``deadline`` seconds names its worker as stalled."""

    def __init__(self, pools, workers: tuple[str, ...], gen_sizes: list[int], cell_sizes: list[int], repeats: int,
                 deadline: float):
        self.pools, self.workers, self.deadline = pools, workers, deadline
        self.args, self.repeats = (gen_sizes, cell_sizes), max(1, repeats)
        self.calls: list | None = None  # ("run", key, warm-up) after the start, then ("end",)
        self.i, self.refs, self.sent = 0, None, 0.0
        self.times: dict = {}

    def _sent(self, refs: dict) -> None:
        self.refs, self.sent = refs, time.monotonic()

    def launch(self) -> None:
        self._sent({w: self.pools.call(w, "calibration_start", *self.args) for w in self.workers})

    def poll(self, now: float) -> bool:
        """Collect the call in flight if every worker answered (else raise past the deadline), send the next;
        True once the stream is done."""
        refs = list(self.refs.values())
        ready, _ = self.pools.wait(refs, len(refs), 0)
        if len(ready) < len(refs):
            if now - self.sent <= self.deadline:
                return False
            late = next(w for w, r in self.refs.items() if r not in ready)
            raise WorkerFailure(late, None, "profiling", f"no answer within {self.deadline:g} s (profiling: one "
                                "timed op; runtime.watchdog_s or its default, docs in runtime/deadlines.py): the "
                                "worker is stalled")
        values = self.pools.get_named(self.refs, "profiling", 0.0)
        if self.calls is None:  # the start answered with the op keys in blocks
            self.calls = [("run", tuple(k), warm) for block in values[0]
                          for warm, keys in [(True, block)] + [(False, block)] * self.repeats for k in keys]
            self.calls.append(("end",))
        elif self.calls[self.i][0] == "run":
            _, key, warm = self.calls[self.i]
            if not warm:
                self.times.setdefault(key, []).append(float(values[0]))  # rank 0's (a shard group's action)
            self.i += 1
        else:
            self.refs = None
            return True
        call = self.calls[self.i]
        if call[0] == "run":
            self._sent({w: self.pools.call(w, "calibration_run", call[1]) for w in self.workers})
        else:
            self._sent({w: self.pools.call(w, "calibration_end") for w in self.workers})
        return False

    def result(self) -> dict:
        """The measurement dicts ``build_profile`` takes, from the mean seconds of each op: {"generate": {size:
        {phase: s}}, "train": {cells: s}, "allreduce": s, "optimizer": s, "publish": s}."""
        times = {k: statistics.fmean(v) for k, v in self.times.items()}
        gen: dict = {}
        for key, v in times.items():
            if key[0] == "generate":
                gen.setdefault(key[1], {})[key[2]] = v
        return {"generate": gen, "train": {k[1]: v for k, v in times.items() if k[0] == "train"},
                "allreduce": times.get(("allreduce",), 0.0), "optimizer": times.get(("optimizer",), 0.0),
                "publish": times.get(("publish",), 0.0)}


def _run_streams(pools, streams: list, echo, limit: int = 200, interval_s: float = 0.1) -> float:
    """Drive the pools' ``_Stream`` s to their ends, all at once, and meanwhile (Ray; ``echo`` None in-process, where the calls run one after the other in this thread) time round
    trips of an empty call to ``echo`` (a ready zero-CPU actor standing in for the next worker to be called),
    every ``interval_s``, at most ``limit``; returns their median (0 without a sample).
    In a run the controller dispatches while the workers compute, and on a node whose cores they occupy that
    costs far more than an idle round trip (on the 2-core CPU benchmark machine: 4-6 ms between a worker's
    actions against a 0.6 ms idle ping); pinging every 10 ms loaded the two cores enough to make the timed
    denoise steps 20-40% slower than in a run, hence the interval."""
    active = list(streams)
    for s in active:
        s.launch()
    samples, last = [], time.monotonic()
    while active:
        pools.wait([r for s in active for r in s.refs.values()], 1, interval_s)
        now = time.monotonic()
        active = [s for s in active if not s.poll(now)]
        if echo is not None and active and len(samples) < limit and now - last >= interval_s:
            import ray

            t0 = time.perf_counter()
            ray.get(echo.ping.remote(), timeout=60.0)  # our own idle zero-CPU actor
            samples.append(time.perf_counter() - t0)
            last = time.monotonic()
    return statistics.median(samples) if samples else 0.0


class _EchoActor:
    """The round-trip probe of ``_run_streams``: an actor whose call does nothing."""

    def ping(self) -> int:
        return 0


def measures(run) -> bool:
    """Whether the run times its ops on its workers before step 1 (``runtime.calibration.when``)."""
    opts = run.cfg.runtime.calibration
    return opts.when == "always" or (opts.when == "auto" and run.profile is None and run.plan.mode.tag)


def cost_model(run, pools, run_dir: Path | None = None):
    """The scheduler's cost model. ``runtime.calibration.when``: ``auto`` measures on the live workers only
    where none is given and the mode needs one (TAG); ``always`` measures in every run (``runtime.profile``, if
    given, still drives the run); ``never`` measures nothing (a TAG mode then needs ``runtime.profile``). A
    measured profile is written to ``run_dir/profile.json``."""
    measured = None
    if measures(run):
        data = calibrate(run, pools, repeats=run.cfg.tuning.calibration_repeats)
        if run_dir is not None:
            save_profile(data, Path(run_dir) / "profile.json")
        measured = ProfileCost.from_dict(data, where="measured profile")
    return run.profile if run.profile is not None else measured
