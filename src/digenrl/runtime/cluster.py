"""Ray session, actor placement and the worker pools.

* ``ray_session``: joins ``runtime.address`` if set, else starts a light local Ray (``num_cpus`` = what the
  pools ask for, no dashboard, quiet logs); an already initialised Ray (tests, notebooks) is reused and left
  running.
* Placement: every worker asks for ``runtime.threads_per_worker`` CPUs (one GPU when ``model.device`` is CUDA)
  plus its pool's resource labels (``runtime.generator_resources`` / ``runtime.trainer_resources``; "CPU" and
  "GPU" keys override the counts). Heterogeneous pools are just different labels, e.g.
  ``generator_resources={"L40S": 1}`` on nodes started with ``ray start --resources='{"L40S": 8}'``. A label the
  cluster does not have is refused up front (``ConfigError`` naming the key) instead of hanging.
* ``start_pools``: creates the actors, waits until they are built (a failure names the worker), measures each
  worker's clock offset (``clocks``: its result stamps on the driver's clock), forms the torch.distributed
  group(s) (rendezvous on a free TCP port of trainer rank 0's node) and publishes version 0.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass, field

from digenrl.config import Config, ConfigError

from .errors import WorkerFailure
from .publish import GroupSpec
from digenrl.control.run_plan import RunPlan


def pool_demand(cfg: Config, pool: str) -> dict[str, float]:
    """Ray resources one worker of ``pool`` ("generator" / "trainer") asks for."""
    rt = cfg.runtime
    res = dict(rt.generator_resources if pool == "generator" else rt.trainer_resources)
    demand = {"CPU": float(res.pop("CPU", rt.threads_per_worker)),
              "GPU": float(res.pop("GPU", 1.0 if cfg.model.device.startswith("cuda") else 0.0))}
    demand.update({k: float(v) for k, v in res.items()})
    return demand


def actor_options(demand: dict[str, float]) -> dict:
    custom = {k: v for k, v in demand.items() if k not in ("CPU", "GPU")}
    return {"num_cpus": demand["CPU"], "num_gpus": demand["GPU"], "resources": custom or None}


def total_demand(run: RunPlan) -> dict[str, float]:
    out: dict[str, float] = {}
    for pool, n in (("generator", len(run.generator_ids)), ("trainer", len(run.trainer_ids))):
        for k, v in pool_demand(run.cfg, pool).items():
            out[k] = out.get(k, 0.0) + n * v
    return out


def check_resources(run: RunPlan, available: dict[str, float]) -> None:
    """Refuse pools the cluster cannot place (they would wait forever)."""
    need = total_demand(run)
    for k, v in need.items():
        if v > 0 and available.get(k, 0.0) + 1e-9 < v:
            rt = run.cfg.runtime
            key = ("runtime.generator_resources" if k in rt.generator_resources else
                   "runtime.trainer_resources" if k in rt.trainer_resources else
                   "model.device" if k == "GPU" else "runtime.threads_per_worker")
            raise ConfigError(f"{key}: the pools need {v:g} x {k!r} in total but the Ray cluster has "
                              f"{available.get(k, 0.0):g} (resources: {dict(sorted(available.items()))})")


def check_local_gpus(run: RunPlan, need: float) -> None:
    """Refuse pools needing more GPUs than this machine has (``ray.init(num_gpus=...)`` would declare them and
    the workers fail later, one by one)."""
    if need <= 0:
        return
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if need > have + 1e-9:
        rt = run.cfg.runtime
        key = ("runtime.generator_resources" if "GPU" in rt.generator_resources else
               "runtime.trainer_resources" if "GPU" in rt.trainer_resources else "model.device")
        raise ConfigError(f"{key}: the pools ({len(run.generator_ids)} generators, {len(run.trainer_ids)} trainers) "
                          f"need {need:g} GPUs in total but this machine has {have} (torch.cuda.device_count()); "
                          "lower runtime.generators / runtime.trainers or the GPU share in runtime.*_resources, "
                          "or join a cluster with runtime.address")


@contextmanager
def ray_session(run: RunPlan):
    """Ray for a run (started, joined or reused), after checking that it can place the run's pools."""
    import ray

    if ray.is_initialized():
        check_resources(run, ray.cluster_resources())
        yield ray
        return
    import signal

    rt = run.cfg.runtime
    quiet = dict(logging_level=logging.ERROR, log_to_driver=False, include_dashboard=False)
    sigterm = signal.getsignal(signal.SIGTERM)
    from digenrl.observe.progress import phase

    if rt.address:
        from .auth import join_cluster

        with phase(run.cfg, f"joining the Ray cluster at {rt.address}"):
            join_cluster(rt.address, **quiet)
    else:
        need = total_demand(run)
        check_local_gpus(run, need.get("GPU", 0.0))  # a local start would declare GPUs this machine lacks
        with phase(run.cfg, "starting a local Ray"):
            ray.init(num_cpus=max(1, int(round(need["CPU"] + 0.4999))), num_gpus=int(need["GPU"]) or None, **quiet)
    if callable(sigterm):  # ray.init replaces the SIGTERM handler; keep the caller's (the CLI's clean stop)
        signal.signal(signal.SIGTERM, sigterm)
    try:
        check_resources(run, ray.cluster_resources())
        yield ray
    finally:
        ray.shutdown()


@dataclass
class ActorPools:
    """Actor handles by worker id, in plan order; trainer rank i = ``trainer_ids[i]``."""

    generators: dict[str, object]   # id -> Ray handle of a ``workers.GeneratorAPI`` actor
    trainers: dict[str, object]     # id -> Ray handle of a ``workers.TrainerAPI`` actor
    publish: str = "object_store"
    grouped: bool = False           # grouped pool (FSDP or sequence-parallel): rank 0's calls that gather state or
    # run the model are collectives of its group
    first_group: tuple[str, ...] = ()  # the ranks of rank 0's group (hybrid sharding: one of several)
    clock_offsets: dict[str, float] = field(default_factory=dict)  # id -> driver clock - its clock (``clocks``)
    clock_error_s: float = 0.0      # the offsets' largest error bound (half a round trip)

    def actor(self, worker: str):
        return self.generators.get(worker) or self.trainers[worker]

    @property
    def rank0(self):
        return next(iter(self.trainers.values()))

    @property
    def rank0_id(self) -> str:
        return next(iter(self.trainers))

    @property
    def rank0_group(self) -> dict:
        """The trainers that take part in a rank-0 call: rank 0 alone, or every rank of rank 0's group (a shard
        group: such a call gathers the shards; a sequence-parallel group: an eval's forwards are collectives of
        its ranks; only rank 0's result carries the value). Under hybrid sharding the other groups hold the same
        weights, optimizer state and EMA, so they are not asked."""
        if not self.grouped:
            return {self.rank0_id: self.rank0}
        return {w: self.trainers[w] for w in self.first_group} if self.first_group else self.trainers

    def on_rank0(self, method: str, *args) -> dict:
        """{rank id: ref} of a rank-0 call (eval, checkpoint), rank 0 first (``rank0_group``)."""
        return {w: getattr(t, method).remote(*args) for w, t in self.rank0_group.items()}

    def publish_refs(self, version: int) -> tuple[dict, object]:
        """Start publishing ``version`` from rank 0: ({worker: ref} that resolve when it is published, state ref).

        Object store: rank 0 puts the state; it is published once it is in the store (each generator
        fetches it when it first generates with that version; the state ref is returned for that).
        Broadcast: rank 0 and every generator join the broadcast; the state ref is None. A sharded pool's
        ranks all take part (they gather the full state together). Stream: the senders (``rank0_group``:
        rank 0, or every rank of its shard group) start their sends and answer at once; each generator's
        call resolves once it holds the version.
        """
        if not self.generators:
            return {}, None
        ranks = self.rank0_group
        if self.publish == "stream":
            refs = {w: t.publish_stream.remote(version) for w, t in ranks.items()}
            return refs | {w: g.receive_stream.remote(version) for w, g in self.generators.items()}, None
        if self.publish == "broadcast":
            refs = {w: t.publish_broadcast.remote(version) for w, t in ranks.items()}
            return refs | {w: g.receive_broadcast.remote(version) for w, g in self.generators.items()}, None
        refs, state_ref = {}, None
        for w, t in ranks.items():
            state, refs[w] = t.publish.options(num_returns=2).remote(version)
            state_ref = state_ref or state  # rank 0's (the first)
        return refs, state_ref

    def kill(self) -> None:
        import ray

        for a in list(self.generators.values()) + list(self.trainers.values()):
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # already dead
                pass


def worker_log_dir(cfg: Config):
    """Where each worker's stdout / stderr goes (absolute: a Ray worker's working directory is not the driver's)."""
    from pathlib import Path

    return Path(cfg.run_dir).expanduser().resolve() / "logs"


def start_pools(run: RunPlan, state: bytes | None = None, failure=None) -> ActorPools:
    """Create the actors, form the groups and publish the first version to the generators: version 0 of rank
    0's build, or the version of ``state`` (a resumable checkpoint every trainer rank loads). ``failure``:
    the test hook handed to the workers (``runtime.inject_failure``)."""
    import ray

    from .clocks import measure_offsets
    from .deadlines import startup_deadline
    from .generator import GeneratorWorker
    from .trainer import TrainerWorker

    cfg = run.cfg
    up = startup_deadline(cfg)
    conf = cfg.model_dump(mode="json")
    gen_cls = ray.remote(**actor_options(pool_demand(cfg, "generator")))(GeneratorWorker)
    trn_cls = ray.remote(**actor_options(pool_demand(cfg, "trainer")))(TrainerWorker)
    logs = worker_log_dir(cfg)  # one file per worker: run_dir/logs/<worker>.log
    pools = ActorPools({w: gen_cls.remote(w, conf, failure, str(logs / f"{w}.log")) for w in run.generator_ids},
                       {w: trn_cls.remote(w, conf, i, failure, str(logs / f"{w}.log"))
                        for i, w in enumerate(run.trainer_ids)},
                       cfg.runtime.publish if run.generator_ids else "object_store", run.grouped,
                       run.ranks_of(run.plan.trainers[0]) if run.grouped else ())
    try:
        get_named({w: pools.actor(w).ping.remote() for w in run.generator_ids + run.trainer_ids}, "startup", up)
        pools.clock_offsets, pools.clock_error_s = measure_offsets(
            {w: lambda w=w: get_named({w: pools.actor(w).clock.remote()}, "clock offsets", up)[0]
             for w in run.generator_ids + run.trainer_ids})
        _form_groups(run, pools, up)
        version = 0
        if state is not None:
            ref = ray.put(state)
            version = get_named({w: t.restore_state.remote(ref) for w, t in pools.trainers.items()}, "restore",
                                up)[0]  # fmt: skip
        _publish_initial(run, pools, version, up)
    except BaseException:
        pools.kill()
        raise
    return pools


def _publish_initial(run: RunPlan, pools: ActorPools, version: int, timeout_s: float | None = None) -> None:
    """Every generator starts from rank 0's ``version`` (whatever its own build produced)."""
    refs, state = pools.publish_refs(version)
    get_named(refs, f"publish of version {version}", timeout_s)
    if state is not None:
        get_named({w: g.load_weights.remote(version, [state]) for w, g in pools.generators.items()},
                  f"publish of version {version}", timeout_s)


def _form_groups(run: RunPlan, pools: ActorPools, timeout_s: float | None = None) -> None:
    """One torch.distributed world: the trainer ranks 0..N_t-1, and where the publish is a collective with the
    generators (broadcast, stream) or the generators are sequence-parallel the generator ranks N_t..N_t+N_g-1; the stream path's senders are the ranks of
    ``rank0_group`` (rank 0, or rank 0's shard group), one group (sender, generators) each."""
    n_t, n_g = len(run.trainer_ids), len(run.generator_ids)
    broadcast = pools.publish in ("broadcast", "stream")
    gen_sp = run.gen_groups is not None  # sequence-parallel generators: their ranks share groups
    if n_t == 1 and not broadcast and not gen_sp:
        return
    ip, port = get_named({run.trainer_ids[0]: pools.rank0.node_endpoint.remote()}, "process-group run", timeout_s)[0]
    backend = "nccl" if run.cfg.model.device.startswith("cuda") else "gloo"
    world = n_t + (n_g if broadcast or gen_sp else 0)
    trainer_ranks = tuple(range(n_t))
    gens = tuple(range(n_t, n_t + n_g))
    publish_ranks = (0,) + gens if pools.publish == "broadcast" and n_g else ()
    fsdp = run.cfg.train.sharding == "fsdp"  # (a sequence-parallel group's ranks hold the same whole weights)
    senders = [run.trainer_ids.index(w) for w in pools.rank0_group] if fsdp else [0]
    streams = tuple((s,) + gens for s in senders) if pools.publish == "stream" and n_g else ()
    shard_size = n_t // run.cfg.train.shard_groups if fsdp and run.cfg.train.shard_groups > 1 else 0
    d, dg = run.sequence_parallel, run.cfg.runtime.generator_sequence_parallel.degree
    sequence = tuple(tuple(range(i, i + d)) for i in range(0, n_t, d)) if d > 1 else ()  # the trainers' lanes
    if gen_sp:
        sequence += tuple(tuple(range(n_t + i, n_t + i + dg)) for i in range(0, n_g, dg))
    refs = {}
    for i, w in enumerate(run.trainer_ids):
        refs[w] = pools.trainers[w].setup_dist.remote(
            GroupSpec(f"tcp://{ip}:{port}", backend, world, i, trainer_ranks, publish_ranks, shard_size, streams,
                      sequence))
    if broadcast or gen_sp:
        for j, w in enumerate(run.generator_ids):
            refs[w] = pools.generators[w].setup_dist.remote(
                GroupSpec(f"tcp://{ip}:{port}", backend, world, n_t + j, trainer_ranks, publish_ranks,
                          shard_size, streams, sequence))
    get_named(refs, "process-group run", timeout_s)


WAIT_SLICE_S = 1.0  # the longest single ray.wait (a signal's handler takes effect only when the call returns)


def wait_sliced(refs: list, num_returns: int, timeout: float | None) -> tuple[list, list]:
    """``ray.wait(refs, num_returns, timeout)`` as a loop of waits of at most ``WAIT_SLICE_S``: a SIGINT /
    SIGTERM handler that raises inside ``ray.wait`` surfaces (as ``SystemError`` from ``Interrupted``,
    ``interrupt.as_interrupted``) only when that wait returns, so a long wait would hold a stop that long."""
    import time

    import ray

    end = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if end is None else max(0.0, end - time.monotonic())
        ready, rest = ray.wait(refs, num_returns=num_returns,
                               timeout=WAIT_SLICE_S if left is None else min(left, WAIT_SLICE_S))
        if len(ready) >= num_returns or (left is not None and left <= WAIT_SLICE_S):
            return ready, rest


def get_named(refs: dict, what: str, timeout_s: float | None = None) -> list:
    """ray.get each ref; a failure raises ``WorkerFailure`` naming the worker. ``timeout_s``: the deadline of
    the whole wait (``runtime.deadlines``); a worker that has not answered by then is stalled (``WorkerFailure``
    naming the first such worker)."""
    import ray

    if refs:  # (in slices: a stop signal is honoured within a second)
        ready = set(wait_sliced(list(refs.values()), len(refs), timeout_s)[0])
        late = [w for w, r in refs.items() if r not in ready]
        if late:
            raise WorkerFailure(late[0], None, what, f"no answer within {timeout_s:g} s ({what}; runtime.watchdog_s "
                                                     "or its default, docs in runtime/deadlines.py): the worker is "
                                                     "stalled")  # fmt: skip
    out = []
    for w, r in refs.items():
        try:
            out.append(ray.get(r))
        except Exception as e:  # RayActorError / RayTaskError
            raise WorkerFailure(w, None, what, error_cause(e)) from e
    return out


def error_cause(e: BaseException) -> str:
    """The root error message of a Ray error (without the remote traceback)."""
    cause = getattr(e, "cause", None) or e
    text = str(cause).strip().splitlines()
    msg = text[-1] if text else ""
    if "Some common causes" in msg:  # Ray's actor-death text: keep the facts, drop the advice
        msg = msg.split("Some common causes")[0].strip()
    return f"{type(cause).__name__}: {msg}"
