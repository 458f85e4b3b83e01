"""Ray session, actor placement and the worker pools (placement and heterogeneous pools: docs/runtime.md).

* ``ray_session``: joins ``runtime.address`` if set, else starts a light local Ray; an already initialised Ray
  (tests, notebooks) is reused and left running. Pools the cluster cannot place (``pool_demand``: CPUs, a GPU
  under CUDA, ``runtime.*_resources`` labels) are refused up front (``ConfigError`` naming the key).
* ``ActorPools``: ``pools.WorkerPools`` over Ray actors; ``start_pools`` creates them.
* ``ready_pools`` (both transports) waits until the workers are built (a failure names the worker), checks that
  the Ray workers share the driver's run directory (``check_shared``), measures their clock offsets
  (``clocks``), forms the torch.distributed group(s) (rendezvous on a free TCP port of trainer rank 0's node)
  and publishes version 0."""

from __future__ import annotations

import logging
import secrets
import signal
import time
from contextlib import contextmanager
from pathlib import Path

from digenrl.config import Config, ConfigError

from digenrl.control.run_plan import RunPlan

from .clocks import measure_offsets
from .deadlines import startup_deadline
from .pools import WorkerPools
from .publish import GroupSpec

SHARED_CHECK = ".shared-check"  # in the workers' log folder: a token per start that every Ray worker reads back


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


def _key_of(rt, resource: str) -> str:
    """The config key that asks for ``resource``."""
    return ("runtime.generator_resources" if resource in rt.generator_resources else
            "runtime.trainer_resources" if resource in rt.trainer_resources else
            "model.device" if resource == "GPU" else "runtime.threads_per_worker")


def check_resources(run: RunPlan, available: dict[str, float]) -> None:
    """Refuse pools the cluster cannot place (they would wait forever)."""
    need = total_demand(run)
    for k, v in need.items():
        if v > 0 and available.get(k, 0.0) + 1e-9 < v:
            raise ConfigError(f"{_key_of(run.cfg.runtime, k)}: the pools need {v:g} x {k!r} in total but the Ray "
                              f"cluster has {available.get(k, 0.0):g} (resources: {dict(sorted(available.items()))})")


def check_local_gpus(run: RunPlan, need: float) -> None:
    """Refuse pools needing more GPUs than this machine has (``ray.init(num_gpus=...)`` would declare them and
    the workers fail later, one by one)."""
    if need <= 0:
        return
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if need > have + 1e-9:
        raise ConfigError(f"{_key_of(run.cfg.runtime, 'GPU')}: the pools ({len(run.generator_ids)} generators, "
                          f"{len(run.trainer_ids)} trainers) need {need:g} GPUs in total but this machine has {have} "
                          "(torch.cuda.device_count()); "
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


WAIT_SLICE_S = 1.0  # the longest single ray.wait (a signal's handler takes effect only when the call returns)


class ActorPools(WorkerPools):
    """``WorkerPools`` over Ray actors: a call is ``handle.method.options(num_returns=n).remote(*args)``, a ref
    an object ref."""

    def call(self, worker: str, method: str, *args, returns: int = 1):
        fn = getattr(self.actor(worker), method)
        return (fn if returns == 1 else fn.options(num_returns=returns)).remote(*args)

    def wait(self, refs: list, num_returns: int, timeout: float | None) -> tuple[list, list]:
        """``ray.wait(refs, num_returns, timeout)`` as a loop of waits of at most ``WAIT_SLICE_S``: a SIGINT /
        SIGTERM handler that raises inside ``ray.wait`` surfaces (as ``SystemError`` from ``Interrupted``,
        ``interrupt.as_interrupted``) only when that wait returns, so a long wait would hold a stop that long."""
        import ray

        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if end is None else max(0.0, end - time.monotonic())
            ready, rest = ray.wait(refs, num_returns=num_returns,
                                   timeout=WAIT_SLICE_S if left is None else min(left, WAIT_SLICE_S))
            if len(ready) >= num_returns or (left is not None and left <= WAIT_SLICE_S):
                return ready, rest

    def get(self, ref):
        import ray

        return ray.get(ref)

    def put(self, value):
        import ray

        return ray.put(value)

    def kill(self) -> None:
        import ray

        for a in list(self.generators.values()) + list(self.trainers.values()):
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # already dead
                pass


def worker_log_dir(cfg: Config):
    """Where each worker's stdout / stderr goes (absolute: a Ray worker's working directory is not the driver's)."""
    return Path(cfg.run_dir).expanduser().resolve() / "logs"


def start_pools(run: RunPlan, state: bytes | None = None, hooks=None, log_dir=None) -> ActorPools:
    """Create the actors (``runtime.*_resources``, a log file each in ``log_dir``, by default ``run_dir/logs/``)
    and ready them (``ready_pools``). ``hooks``: the test hooks handed to the workers
    (``control.run_plan.TestHooks``)."""
    import ray

    from .generator import GeneratorWorker
    from .trainer import TrainerWorker

    cfg = run.cfg
    conf = cfg.model_dump(mode="json")
    gen_cls = ray.remote(**actor_options(pool_demand(cfg, "generator")))(GeneratorWorker)
    trn_cls = ray.remote(**actor_options(pool_demand(cfg, "trainer")))(TrainerWorker)
    logs = Path(log_dir).resolve() if log_dir is not None else worker_log_dir(cfg)  # one file per worker: <w>.log
    return built_pools(ActorPools, run, state, lambda w: gen_cls.remote(w, conf, hooks, str(logs / f"{w}.log")),
                       lambda w, i: trn_cls.remote(w, conf, i, hooks, str(logs / f"{w}.log")), logs)


def built_pools(cls, run: RunPlan, state: bytes | None, generator, trainer, logs: Path | None = None) -> WorkerPools:
    """``cls`` (a ``WorkerPools`` transport) over the workers ``generator(id)`` / ``trainer(id, rank)`` build,
    readied (``ready_pools``; on a failure every worker is ended). ``logs``: the Ray workers' log folder (None:
    workers in this process)."""
    pools = cls({w: generator(w) for w in run.generator_ids},
                {w: trainer(w, i) for i, w in enumerate(run.trainer_ids)},
                run.cfg.runtime.publish if run.generator_ids else "object_store", run.grouped,
                run.ranks_of(run.plan.trainers[0]) if run.grouped else ())
    try:
        ready_pools(run, pools, state, logs)
    except BaseException:
        pools.kill()
        raise
    return pools


def ready_pools(run: RunPlan, pools: WorkerPools, state: bytes | None = None, logs: Path | None = None) -> None:
    """Wait until the workers are built (a failure names the worker), check that they share ``logs`` (Ray), measure
    their clock offsets, form the groups and publish the first version to the generators: version 0 of rank 0's
    build, or the version of ``state`` (a resumable checkpoint every trainer rank loads). Both transports."""
    up = startup_deadline(run.cfg)
    workers = run.generator_ids + run.trainer_ids
    pools.get_named({w: pools.call(w, "ping") for w in workers}, "startup", up)
    if logs is not None:
        check_shared(run, pools, logs, up)
    pools.clock_offsets, pools.clock_error_s = measure_offsets(
        {w: lambda w=w: pools.get_named({w: pools.call(w, "clock")}, "clock offsets", up)[0] for w in workers})
    _form_groups(run, pools, up)
    version = 0
    if state is not None:
        ref = pools.put(state)
        version = pools.get_named({w: pools.call(w, "restore_state", ref) for w in pools.trainers}, "restore", up)[0]
    _publish_initial(pools, version, up)


def check_shared(run: RunPlan, pools: WorkerPools, logs: Path, timeout_s: float | None = None) -> None:
    """Every Ray worker should see the driver's log folder ``logs`` (``run_dir/logs``; ``digenrl profile``'s
    beside the profile) as the same directory: the driver writes a fresh token into it, each worker reads it back
    (``sees``), and the driver removes it. Where a node's workers do not (a run_dir on node-local disk), their
    logs stay on that node, said once; and under ``train.sharding=fsdp`` with shard groups of several ranks the
    run is refused (``ConfigError`` naming run_dir, the nodes and the workers): each such rank writes its own
    shards of a checkpoint into run_dir, so a checkpoint would miss the shards of the ranks on other nodes."""
    from digenrl.observe.progress import line
    from digenrl.safe_files import atomic_write_bytes

    token = secrets.token_hex(16)
    logs.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(logs / SHARED_CHECK, token.encode())
    workers = run.generator_ids + run.trainer_ids
    try:
        seen = pools.get_named({w: pools.call(w, "sees", str(logs / SHARED_CHECK), token) for w in workers},
                               "startup", timeout_s)
    finally:
        (logs / SHARED_CHECK).unlink(missing_ok=True)  # read by all: the folder keeps only the logs
    apart: dict[str, list[str]] = {}  # node -> its workers that do not see it
    for w, (node, ok) in zip(workers, seen):
        if not ok:
            apart.setdefault(node, []).append(w)
    if not apart:
        return
    where = "; ".join(f"node {node} ({', '.join(ws)})" for node, ws in apart.items())
    cfg = run.cfg
    checkpoints = logs == worker_log_dir(cfg)  # a training run's (not ``digenrl profile``'s, which writes none)
    if checkpoints and cfg.train.sharding == "fsdp" and len(run.trainer_ids) > cfg.train.shard_groups and any(
            w in run.trainer_ids for ws in apart.values() for w in ws):
        raise ConfigError(f"run_dir: {str(logs.parent)!r} is not the same directory on {where}: under "
                          "train.sharding=fsdp every trainer rank writes its own shards of a checkpoint there, so a "
                          "checkpoint would miss theirs; put run_dir on storage every node mounts at the same path")
    line(f"digenrl: warning: {logs} is not shared with {where}: their logs stay on their nodes, under that path")


def _publish_initial(pools: WorkerPools, version: int, timeout_s: float | None = None) -> None:
    """Every generator starts from rank 0's ``version`` (whatever its own build produced)."""
    refs, state = pools.publish_refs(version)
    pools.get_named(refs, f"publish of version {version}", timeout_s)
    if state is not None:
        pools.get_named({w: pools.call(w, "load_weights", version, [state]) for w in pools.generators},
                        f"publish of version {version}", timeout_s)


def _form_groups(run: RunPlan, pools: WorkerPools, timeout_s: float | None = None) -> None:
    """One torch.distributed world: the trainer ranks 0..N_t-1, and where the publish is a collective with the
    generators (broadcast, stream) or the generators are sequence-parallel the generator ranks N_t..N_t+N_g-1; one
    group (sender, generators) per sender of the publish: rank 0 (broadcast), or the ranks of ``rank0_group``
    (stream: rank 0, or rank 0's shard group)."""
    n_t, n_g = len(run.trainer_ids), len(run.generator_ids)
    broadcast = pools.publish in ("broadcast", "stream")
    gen_sp = run.gen_groups is not None  # sequence-parallel generators: their ranks share groups
    if n_t == 1 and not broadcast and not gen_sp:
        return
    ip, port = pools.get_named({pools.rank0_id: pools.call(pools.rank0_id, "node_endpoint")}, "process-group run",
                               timeout_s)[0]  # fmt: skip
    backend = "nccl" if run.cfg.model.device.startswith("cuda") else "gloo"
    world = n_t + (n_g if broadcast or gen_sp else 0)
    trainer_ranks = tuple(range(n_t))
    gens = tuple(range(n_t, n_t + n_g))
    fsdp = run.cfg.train.sharding == "fsdp"  # (a sequence-parallel group's ranks hold the same whole weights)
    senders = [run.trainer_ids.index(w) for w in pools.rank0_group] if fsdp and pools.publish == "stream" else [0]
    streams = tuple((s,) + gens for s in senders) if broadcast and n_g else ()
    shard_size = n_t // run.cfg.train.shard_groups if fsdp and run.cfg.train.shard_groups > 1 else 0
    d, dg = run.sequence_parallel, run.cfg.runtime.generator_sequence_parallel.degree
    sequence = tuple(tuple(range(i, i + d)) for i in range(0, n_t, d)) if d > 1 else ()  # the trainers' lanes
    if gen_sp:
        sequence += tuple(tuple(range(n_t + i, n_t + i + dg)) for i in range(0, n_g, dg))
    ranks = enumerate(run.trainer_ids + (run.generator_ids if broadcast or gen_sp else ()))  # generators: N_t..
    refs = {w: pools.call(w, "setup_dist", GroupSpec(f"tcp://{ip}:{port}", backend, world, i, trainer_ranks,
                                                     shard_size, streams, sequence)) for i, w in ranks}
    pools.get_named(refs, "process-group run", timeout_s)
