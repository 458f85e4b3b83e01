"""Driver-side calibration: a measured cost profile of the live workers of a run.

Every op of ``schedule.cost`` is timed inside the actors of the configured pools (``timing``), so threads,
placement and the Ray call overhead are those of a run; one generator and the trainer ranks measure at the
same time, as they work in a pipelined step (``calibrate(concurrent=False)`` measures them one after the
other). Each op gets one actor-call round trip added (``transfer``, ``train_chunk``, ``optimizer``,
``publish``); ``tag_switch`` = 0 (no inference copy to build without FSDP).

The dict is the ``digenrl-profile`` schema of ``digenrl.control.profile`` (``profile_dict``, written by
``save_profile``; ``simulate --profile`` reads it).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from digenrl.control.profile import profile_dict
from digenrl.schedule.cost import GENERATOR, TRAINER


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
    """Fragment sizes and chunk sizes (cells) a run of ``plan`` uses."""
    from digenrl.schedule import classic_chunks, group_fragments, tsp_chunks

    frags = {f.size for f in group_fragments(plan, 0, 0)}
    chunks = {c.size for c in tsp_chunks(plan, 0, 0)} if plan.mode.tsp else {
        c.size for g in range(plan.prompts) for cs in classic_chunks(plan, 0, g).values() for c in cs}
    return sorted(frags), sorted(chunks)


def calibrate(run, pools, repeats: int = 2, gen_sizes: list[int] | None = None,
              cell_sizes: list[int] | None = None, trainer_generation: bool | None = None,
              concurrent: bool = True) -> dict:
    """Measure the ops on the live workers.

    ``concurrent``: one generator and every trainer rank measure at the same time, as the pools work in a
    pipelined step (on a shared CPU node they slow each other down; on separate GPUs it changes nothing);
    else the generator first, then the trainer ranks (together: their all-reduce is a collective).
    """
    from .deadlines import call_deadline, op_deadline, remote_reward_wait

    plan = run.plan
    fs, cs = plan_sizes(plan)
    gen_sizes, cell_sizes = gen_sizes or fs, cell_sizes or cs
    rank0 = next(iter(pools.trainers))
    # deadlines (runtime.deadlines): a stalled worker is a WorkerFailure naming it, never a hang
    ping_s = call_deadline(run.cfg)
    gen_s = op_deadline(run.cfg, len(gen_sizes) * repeats) + remote_reward_wait(run.cfg)
    trn_s = op_deadline(run.cfg, (len(gen_sizes) if trainer_generation is not False else 0) * repeats
                        + len(cell_sizes) * repeats) + remote_reward_wait(run.cfg)  # fmt: skip
    pools.get_named({rank0: pools.call(rank0, "ping")}, "profiling", ping_s)
    pings = []
    for _ in range(7):
        t0 = time.perf_counter()
        pools.get_named({rank0: pools.call(rank0, "ping")}, "profiling", ping_s)
        pings.append(time.perf_counter() - t0)
    overhead = statistics.median(pings)
    if trainer_generation is None:
        trainer_generation = plan.mode.tag or not plan.mode.disaggregated
    echo = None
    if not pools.in_process:  # (in-process calls run one after the other: no round trip while they run)
        import ray

        echo = ray.remote(num_cpus=0)(_EchoActor).remote()  # started (a worker process), ready before any timing
        pools.get_named({"echo": echo.ping.remote()}, "profiling", ping_s)
    try:
        t_gen = time.monotonic()
        first = run.ranks_of(plan.generators[0]) if plan.generators else ()  # (a sequence-parallel one: its ranks)
        gen_refs = {w: pools.call(w, "measure_generate", gen_sizes, repeats) for w in first}
        if not concurrent:
            pools.get_named(gen_refs, "profiling", gen_s)
        t_trn = time.monotonic()
        trn_refs = {w: pools.call(w, "measure", gen_sizes if trainer_generation else [], cell_sizes, repeats)
                    for w in pools.trainers}
        if echo is not None:
            overhead = max(overhead, _loaded_round_trip(echo, list(gen_refs.values()) + list(trn_refs.values()),
                                                        until=time.monotonic() + min(gen_s, trn_s)))  # fmt: skip
    finally:
        if echo is not None:
            ray.kill(echo)
    gen = pools.get_named(gen_refs, "profiling", max(1e-3, t_gen + gen_s - time.monotonic()))[0] if gen_refs else {}
    meas = pools.get_named(trn_refs, "profiling", max(1e-3, t_trn + trn_s - time.monotonic()))[0]
    source = (f"digenrl runtime profile: {run.cfg.model.kind}, {rank0} + {len(pools.generators)} generators, "
              f"{run.cfg.runtime.threads_per_worker} threads/worker, {time.strftime('%Y-%m-%d %H:%M')}")
    return build_profile(gen, meas["generate"], meas, plan.sampling_steps, overhead, source,
                         (len(pools.generators), len(pools.trainers)))


class _EchoActor:
    """The round-trip probe of ``_loaded_round_trip``: an actor whose call does nothing."""

    def ping(self) -> int:
        return 0


def _loaded_round_trip(echo, busy: list, limit: int = 200, interval_s: float = 0.1, until: float | None = None) -> float:
    """Median round trip of an empty call to ``echo`` while the pools measure (``busy`` refs in flight): in a
    run the controller dispatches while workers compute, and on a node whose cores they occupy that costs far
    more than an idle round trip (on the 2-core CPU benchmark machine: 4-6 ms between a worker's actions
    against a 0.6 ms idle ping). ``echo``, a ready zero-CPU actor, stands in for the next worker to be called.
    Samples are ``interval_s`` apart: pinging every 10 ms loaded the two cores enough to make the timed
    denoise steps 20-40% slower than in a run. 0 when the pools were done before any sample. ``until``: a
    ``time.monotonic()`` past which no more samples are taken (the measurements' deadline)."""
    import ray

    samples = []
    while len(samples) < limit and ray.wait(busy, num_returns=len(busy), timeout=0)[1]:
        if until is not None and time.monotonic() >= until:
            break
        t0 = time.perf_counter()
        ray.get(echo.ping.remote(), timeout=60.0)  # our own idle zero-CPU actor
        samples.append(time.perf_counter() - t0)
        time.sleep(interval_s)
    return statistics.median(samples) if samples else 0.0


def measures(run) -> bool:
    """Whether the run times its ops on its workers before step 1 (``runtime.calibration.when``)."""
    opts = run.cfg.runtime.calibration
    return opts.when == "always" or (opts.when == "auto" and run.profile is None and run.plan.mode.tag)


def cost_model(run, pools, run_dir: Path | None = None):
    """The scheduler's cost model. ``runtime.calibration.when``: ``auto`` measures on the live workers only
    where none is given and the mode needs one (TAG); ``always`` measures in every run (``runtime.profile``, if
    given, still drives the run); ``never`` measures nothing (a TAG mode then needs ``runtime.profile``). A
    measured profile is written to ``run_dir/profile.json``."""
    from digenrl.control.profile import ProfileCost, save_profile

    opts = run.cfg.runtime.calibration
    measured = None
    if measures(run):
        data = calibrate(run, pools, repeats=opts.repeats)
        if run_dir is not None:
            save_profile(data, Path(run_dir) / "profile.json")
        measured = ProfileCost.from_dict(data, where="measured profile")
    return run.profile if run.profile is not None else measured
