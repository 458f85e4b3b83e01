"""The in-process transport: the generator and trainer workers as plain objects of this process, no Ray
(docs/architecture.md, "Executors").

``LocalPools`` implements ``pools.WorkerPools``: a call is queued when it is made and runs when a wait or a get
needs its result, one at a time in the order they were made (as an actor runs its calls), so the controller, the
executor and the scheduler are exactly a Ray run's; a call's arguments may hold refs (``worker_base.fetch``). A
worker that raises fails its call (``WorkerFailure``, recovery). No watchdog: a call runs in the controller's own
thread; a stop signal is honoured at the next step boundary."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

from digenrl.control.loop import run_loop
from digenrl.control.run_plan import RunPlan, plan_run
from digenrl.control.timeline import Timeline
from digenrl.schedule import Scheduler

from .clocks import Clock
from .cluster import built_pools, ready_pools
from .errors import WorkerFailure
from .executor import WorkerExecutor
from .pools import WorkerPools, error_cause


@dataclass(eq=False)
class _Call:
    fn: object
    args: tuple
    returns: int
    done: bool = False
    value: object = None
    error: BaseException | None = None


@dataclass(frozen=True, eq=False)
class LocalRef:
    """The ``index``-th returned value of an in-process call (hashable by identity, as an object ref)."""

    call: _Call
    index: int = 0

    @property
    def done(self) -> bool:
        return self.call.done


def _resolved(arg):
    """``arg`` with its refs replaced by their values (inside lists and tuples too)."""
    if isinstance(arg, LocalRef):
        return arg.call.value if arg.call.returns == 1 else arg.call.value[arg.index]
    if isinstance(arg, (list, tuple)):
        return type(arg)(_resolved(a) for a in arg)
    return arg


@dataclass
class LocalPools(WorkerPools):
    """``WorkerPools`` over worker objects of this process (module docstring)."""

    in_process = True
    _queue: deque = field(default_factory=deque, repr=False)

    def call(self, worker: str, method: str, *args, returns: int = 1):
        c = _Call(getattr(self.actor(worker), method), args, returns)
        self._queue.append(c)
        return LocalRef(c) if returns == 1 else tuple(LocalRef(c, i) for i in range(returns))

    def wait(self, refs: list, num_returns: int, timeout: float | None) -> tuple[list, list]:
        """Run the queued calls, oldest first, until ``num_returns`` of ``refs`` are done (``timeout`` 0: run
        nothing; otherwise unused: a call in this thread cannot be waited out)."""
        while timeout != 0 and self._queue and sum(r.done for r in refs) < num_returns:
            self._run(self._queue.popleft())
        return [r for r in refs if r.done], [r for r in refs if not r.done]

    def get(self, ref: LocalRef):
        self.wait([ref], 1, None)  # (a get without a wait: its call and those before it run now)
        if not ref.done:
            raise RuntimeError("in-process pools: a ref of a call that was never made")
        if ref.call.error is not None:
            raise ref.call.error
        return _resolved(ref)

    def put(self, value):
        return value

    def kill(self) -> None:
        self._queue.clear()

    @staticmethod
    def _run(c: _Call) -> None:
        try:
            c.value = c.fn(*(_resolved(a) for a in c.args))
        except Exception as e:  # the call fails; the caller's get raises it (a Ray actor's error, in-process)
            c.error = e
        c.done = True


def in_process(run: RunPlan) -> bool:
    """Whether ``run`` can run in this process: one worker, a colocated one (no process group to form, no
    second device to place)."""
    return not run.generator_ids and len(run.trainer_ids) == 1


def start_local_pools(run: RunPlan, state: bytes | None = None, hooks=None) -> LocalPools:
    """The run's workers built in this process (no log files: their output is this process's) and readied as
    Ray's are (``cluster.ready_pools``); ``state``, ``hooks``: as ``cluster.start_pools``."""
    from .generator import GeneratorWorker
    from .trainer import TrainerWorker

    conf = run.cfg.model_dump(mode="json")

    def build(w: str, make):
        try:
            return make()
        except Exception as e:  # as a Ray actor's constructor error: a failed worker, named
            raise WorkerFailure(w, None, "startup", error_cause(e)) from e

    return built_pools(LocalPools, run, state, lambda w: build(w, lambda: GeneratorWorker(w, conf, hooks)),
                       lambda w, i: build(w, lambda: TrainerWorker(w, conf, i, hooks)))


def colocated_worker(cfg, *, policy=None, reward=None, task=None):
    """The colocated trainer worker ``col0`` of ``cfg`` built in this process; ``policy`` / ``reward`` / ``task``:
    objects it uses instead of the config's (its context is built with them: a model given as an object, a
    benchmark's random-weight policy, a test's stand-in)."""
    from digenrl.train.context import build_context

    from .trainer import TrainerWorker

    ctx = build_context(cfg, policy=policy, reward=reward, task=task) if (policy, reward, task) != (None,) * 3 else None
    return TrainerWorker("col0", cfg.model_dump(mode="json"), 0, ctx=ctx)


def run_steps(cfg, worker, *, first: int = 0, steps: int | None = None, state: bytes | None = None):
    """The product's steps of ``cfg`` in this process on one colocated trainer ``worker`` (a ``TrainerWorker``,
    possibly built around a caller's policy), without a run directory: the scheduler, the control loop, the worker
    executor and ``LocalPools``, as ``digenrl train`` runs them; no eval, no checkpoint. ``first``: the step the
    worker's weights are at; ``state``: a resumable checkpoint's bytes it restores first (``first`` becomes its
    step). Returns the steps' metric rows (``runtime.step_metrics``)."""
    from .step_metrics import StepMetrics

    run = plan_run(cfg)
    if run.generator_ids or run.trainer_ids != ("col0",):
        raise ValueError("run_steps: one colocated worker (runtime.mode=colocated, runtime.trainers=1)")
    pools = LocalPools({}, {"col0": worker})
    ready_pools(run, pools, state)
    if state is not None:
        first = worker.tx.version
    plan = replace(run.plan, steps=first + (cfg.steps if steps is None else steps))
    clock, timeline, metrics = Clock(), Timeline(plan), StepMetrics(plan)
    clock.use(pools.clock_offsets)
    metrics.replay_from(first, 0, 0.0)
    observer = SimpleNamespace(on_completion=metrics.record, after_wait=lambda: None)
    run_loop(Scheduler(plan, first_step=first), WorkerExecutor(run, pools, clock, first), timeline, observer)
    return metrics.rows_ready(timeline.spans)  # (one worker: nothing runs across a publish, so no row changes)
