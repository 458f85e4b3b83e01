"""The controller's view of its workers: handles by worker id, and how a call reaches them.

``WorkerPools`` is all the executor, the controller, the calibration and the cluster setup know of the workers:
``call(worker, method, *args, returns=n)`` starts a declared method (``workers.GeneratorAPI`` / ``TrainerAPI``)
and gives back its ref (or a tuple of n), ``wait`` tells which refs are done, ``get`` reads one (raising what
the call raised). Two transports implement them: ``cluster.ActorPools`` (Ray actors) and ``local.LocalPools``
(the same classes in this process). The rest (rank 0's calls, the publish, the named waits that turn a failed
call into ``WorkerFailure``) is written once, here."""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import WorkerFailure


@dataclass
class WorkerPools:
    """Worker handles by worker id, in plan order; trainer rank i = ``trainers``' i-th."""

    generators: dict[str, object]   # id -> handle of a ``workers.GeneratorAPI`` worker
    trainers: dict[str, object]     # id -> handle of a ``workers.TrainerAPI`` worker
    publish: str = "object_store"
    grouped: bool = False           # grouped pool (FSDP or sequence-parallel): rank 0's calls that gather state or
    # run the model are collectives of its group
    first_group: tuple[str, ...] = ()  # the ranks of rank 0's group (hybrid sharding: one of several)
    clock_offsets: dict[str, float] = field(default_factory=dict)  # id -> driver clock - its clock (``clocks``)
    clock_error_s: float = 0.0      # the offsets' largest error bound (half a round trip)
    in_process = False              # the workers are objects of this process (``local.LocalPools``)

    # ---- the transport (``cluster.ActorPools``, ``local.LocalPools``) --------------------------------------
    def call(self, worker: str, method: str, *args, returns: int = 1):
        """Start ``worker.method(*args)``; its ref, or a tuple of ``returns`` refs (one per returned value)."""
        raise NotImplementedError

    def wait(self, refs: list, num_returns: int, timeout: float | None) -> tuple[list, list]:
        """(done refs, the others) once ``num_returns`` of ``refs`` are done or ``timeout`` seconds passed."""
        raise NotImplementedError

    def get(self, ref):
        """The value behind a done ref; raises what its call raised."""
        raise NotImplementedError

    def put(self, value):
        """A ref of ``value`` that calls may take as an argument (Ray: in the object store)."""
        raise NotImplementedError

    def kill(self) -> None:
        """End every worker (a later run starts fresh ones)."""
        raise NotImplementedError

    # ---- written once ------------------------------------------------------------------------------------
    def actor(self, worker: str):
        return self.generators.get(worker) or self.trainers[worker]

    @property
    def rank0_id(self) -> str:
        return next(iter(self.trainers))

    @property
    def rank0_group(self) -> tuple[str, ...]:
        """The trainers that take part in a rank-0 call: rank 0 alone, or every rank of rank 0's group (a shard
        group: such a call gathers the shards; a sequence-parallel group: an eval's forwards are collectives of
        its ranks; only rank 0's result carries the value). Under hybrid sharding the other groups hold the same
        weights, optimizer state and EMA, so they are not asked."""
        if not self.grouped:
            return (self.rank0_id,)
        return self.first_group or tuple(self.trainers)

    def on_rank0(self, method: str, *args) -> dict:
        """{rank id: ref} of a rank-0 call (eval, checkpoint), rank 0 first (``rank0_group``)."""
        return {w: self.call(w, method, *args) for w in self.rank0_group}

    def get_named(self, refs: dict, what: str, timeout_s: float | None = None) -> list:
        """The values of ``refs`` ({worker: ref}); a failure raises ``WorkerFailure`` naming the worker.
        ``timeout_s``: the deadline of the whole wait (``runtime.deadlines``); a worker that has not answered
        by then is stalled (``WorkerFailure`` naming the first such worker)."""
        if refs:
            ready = set(self.wait(list(refs.values()), len(refs), timeout_s)[0])
            late = [w for w, r in refs.items() if r not in ready]
            if late:
                raise WorkerFailure(late[0], None, what, f"no answer within {timeout_s:g} s ({what}; "
                                                         "runtime.watchdog_s or its default, docs in "
                                                         "runtime/deadlines.py): the worker is stalled")
        out = []
        for w, r in refs.items():
            try:
                out.append(self.get(r))
            except Exception as e:  # the worker raised, or (Ray) its process died
                raise WorkerFailure(w, None, what, error_cause(e)) from e
        return out

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
            refs = {w: self.call(w, "publish_stream", version) for w in ranks}
            return refs | {w: self.call(w, "receive_stream", version) for w in self.generators}, None
        if self.publish == "broadcast":
            refs = {w: self.call(w, "publish_broadcast", version) for w in ranks}
            return refs | {w: self.call(w, "receive_broadcast", version) for w in self.generators}, None
        refs, state_ref = {}, None
        for w in ranks:
            state, refs[w] = self.call(w, "publish", version, returns=2)
            state_ref = state_ref or state  # rank 0's (the first)
        return refs, state_ref

    def abort(self, timeout_s: float = 30.0) -> None:
        """Drop every open transaction on the trainers still alive (best effort: the workers are ended next)."""
        refs = [self.call(w, "abort") for w in self.trainers]
        self.wait(refs, len(refs), timeout_s)


def error_cause(e: BaseException) -> str:
    """The root error message of a failed call (without a Ray error's remote traceback)."""
    cause = getattr(e, "cause", None) or e
    text = str(cause).strip().splitlines()
    msg = text[-1] if text else ""
    if "Some common causes" in msg:  # Ray's actor-death text: keep the facts, drop the advice
        msg = msg.split("Some common causes")[0].strip()
    return f"{type(cause).__name__}: {msg}"
