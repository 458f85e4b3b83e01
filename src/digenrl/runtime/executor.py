"""The worker executor: scheduler actions -> worker calls; finished calls -> ``Completion`` records on the driver's
clock (``clocks.Clock``: worker stamps mapped onto it).

``WorkerExecutor`` implements ``control.loop.Executor`` over ``pools.WorkerPools`` (Ray actors or objects of
this process). It moves refs only: a ``Generate`` leaves its trajectories with the transport (ref kept per
(step, group)) and carries the published weights' ref when the generator does not hold that version yet; a
``Train`` hands the trainer the refs of its group's fragments. ``Commit`` and ``Publish`` are barriers over
several calls. Calls that complete together are reported in the loop's tie order. A failed call, or one not
answered within its watchdog budget (``budget(action)`` seconds), raises ``WorkerFailure`` naming the worker.

A grouped trainer (``RunPlan.shards``: a shard group or a sequence-parallel lane) runs each action on every rank
(a collective) and completes when the last rank answered; the ranks' results are merged (a fragment's rewards
in generation order, one chunk record, the ranks' loss statistics summed).

Before a ``Commit`` the executor checks I2 from what the trainers recorded: the union of the round's chunk cells
is exactly the grid of the round's groups, each cell once. It keeps the fragments' rewards (plain numbers) and
hands every ``Train`` and ``Commit`` those of the step's complete groups (``step_rewards``), from which the
trainers compute advantages and loss scales; it computes nothing of the loss and imports no torch."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from digenrl.control.loop import Completion, Interval, SideCall, tie_order
from digenrl.control.run_plan import RunPlan
from digenrl.schedule import Action, Commit, Generate, Publish, Train, step_number
from digenrl.schedule.layout import gang_shares, grid_cells

from .clocks import Clock
from .pools import WorkerPools, error_cause
from .errors import WorkerFailure


@dataclass
class _Call:
    """One action (or side call) in flight; done when every ref resolved."""

    action: Action | None
    side: SideCall | None
    step: int | None
    start: float                              # driver time (run-relative) when launched
    workers: dict = field(default_factory=dict)   # ref -> worker id, in launch order
    results: dict = field(default_factory=dict)   # ref -> result
    deadline: float | None = None             # driver time by which it must have answered (watchdog)

    @property
    def shown_step(self) -> int | None:
        """The step a person reads (``WorkerFailure.step``): an action's ``schedule.step_number``; a side call's
        ``step`` is the steps done already (the eval or checkpoint after that step), that step's number."""
        return step_number(self.step) if self.action is not None else self.step

    @property
    def what(self) -> str:
        a = self.action  # what a failed call was doing, for ``WorkerFailure``
        return f"{a.span_kind} {a.label()}" if a is not None else str(self.side)


@dataclass
class _StepRefs:
    """What the executor keeps about one step until its commit."""

    fragments: dict = field(default_factory=dict)   # group -> {fragment: [trajectories refs, one per rank]}
    cells: list = field(default_factory=list)       # cells the trainers recorded in the current round
    uids: dict = field(default_factory=dict)        # group -> prompt uid
    rewards: dict = field(default_factory=dict)     # group -> {generation: reward}
    parts: dict = field(default_factory=dict)       # group -> {reward part: {generation: value}}


class WorkerExecutor:
    """``version``: the weights every worker holds at the start (the first step of a resumed or recovered run);
    ``budget``: the watchdog's seconds for an action, or None for no deadline (side calls: ``budget(None)``);
    ``observed``: told each completed action's seconds from launch (``deadlines.ObservedCosts``), which a budget
    without a cost model derives its deadlines from."""

    def __init__(self, run: RunPlan, pools: WorkerPools, clock: Clock, version: int = 0,
                 budget: Callable[[Action | None], float | None] = lambda a: None, observed=None):
        self.run, self.pools, self.clock, self.budget, self.observed = run, pools, clock, budget, observed
        self.plan = run.plan
        self._calls: dict = {}                 # ref -> _Call
        self._ready: list[_Call] = []          # calls complete without any ref (publish to no generator)
        self._steps: dict[int, _StepRefs] = {}
        self._weights: dict[int, object] = {}          # version -> published state ref (object store)
        self._held = {w: version for w in self.plan.generators}  # version each generator holds (or is sent)
        self._group_of = {r: w for w in self.plan.trainers + self.plan.generators for r in run.ranks_of(w)}
        # (rank -> the scheduler's worker: a shard group, a sequence-parallel lane or generator)

    @property
    def idle(self) -> bool:
        return not self._calls and not self._ready

    def _step(self, k: int) -> _StepRefs:
        return self._steps.setdefault(k, _StepRefs())

    # ---- launching -----------------------------------------------------------------------------------
    def launch(self, actions: Sequence[Action]) -> None:
        for a in actions:
            self._launch(a)

    def _launch(self, a: Action) -> None:
        now = self.clock.now()
        if isinstance(a, Generate):
            f = a.fragment
            args = (f, a.version)
            if a.worker in self._held and self._held[a.worker] != a.version:  # a generator, new version
                args += ([self._weights[a.version]] if a.version in self._weights else None,)
                self._held[a.worker] = a.version
            refs, ranks = {}, self.run.ranks_of(a.worker)
            if a.more:  # a gang over several groups: each rank samples its round-robin share in one batch
                by_part: list[list] = [[] for _ in a.fragments]
                d = self.run.sequence_parallel  # the ranks of a lane share its part (one sequence split over them)
                lanes = gang_shares(a.fragments, len(ranks) // d)
                for w, share in zip(ranks, [lanes[i // d] for i in range(len(ranks))]):
                    *trajs, info = self.pools.call(w, "generate_gang", tuple(share), a.version, returns=len(share) + 1)
                    for lst, ref in zip(by_part, trajs):
                        lst.append(ref)
                    refs[info] = w
            else:
                by_part = [[]]
                for w in ranks:
                    traj, info = self.pools.call(w, "generate", *args, returns=2)
                    by_part[0].append(traj)
                    refs[info] = w
            for p, lst in zip(a.fragments, by_part):
                self._step(p.step).fragments.setdefault(p.group, {})[p] = lst
        elif isinstance(a, Train):
            c = a.chunk
            frags = self._step(c.step).fragments[c.group]
            trajs = [r for f in sorted(frags) for r in frags[f]]
            rewards, parts = self.step_rewards(c.step)
            refs = {self.pools.call(w, "train", c, trajs, rewards, parts): w for w in self.run.ranks_of(a.rank)}
        elif isinstance(a, Commit):
            self._check_cells(a.step, a.round)
            rewards, parts = self.step_rewards(a.step)
            refs = {self.pools.call(w, "commit", a.step, a.round, a.final, rewards, parts): w
                    for r in a.workers for w in self.run.ranks_of(r)}
        else:
            by_worker, state = self.pools.publish_refs(a.version)
            if state is not None:
                self._weights = {a.version: state}  # generators need only the newest version
            refs = {r: w for w, r in by_worker.items()}
        self._track(_Call(a, None, a.step, now), refs)

    def _by_group(self, work: list[Interval]) -> tuple[Interval, ...]:
        """The ranks' busy intervals as the scheduler's workers': a shard group is busy from its first rank's
        start to its last rank's end."""
        out: dict[str, Interval] = {}
        for w in work:
            g = self._group_of.get(w.worker, w.worker)
            o = out.get(g)
            out[g] = Interval(g, w.start, w.end) if o is None else Interval(g, min(o.start, w.start), max(o.end, w.end))
        return tuple(out.values())

    def side(self, refs: dict, kind: SideCall, step: int | None) -> None:
        """Track a call outside the scheduler (``kind`` "eval" / "checkpoint"; ``refs``: {worker: ref}, rank 0
        first) so its failure stops the run."""
        self._track(_Call(None, kind, step, self.clock.now()), {r: w for w, r in refs.items()})

    def _track(self, call: _Call, refs: dict) -> None:
        call.workers = dict(refs)
        b = self.budget(call.action)
        call.deadline = None if b is None else call.start + b
        if not refs:
            self._ready.append(call)
        for r in refs:
            self._calls[r] = call

    # ---- completions ---------------------------------------------------------------------------------
    def wait(self) -> list[Completion]:
        """Block until at least one call completed; every call complete now, in the loop's tie order."""
        if not self._ready:
            if not self._calls:
                raise RuntimeError("executor: waiting with nothing in flight (the schedule is stuck)")
            refs = list(self._calls)
            due = min((c.deadline for c in self._calls.values() if c.deadline is not None), default=None)
            timeout = None if due is None else max(0.0, due - self.clock.now())
            ready, rest = self.pools.wait(refs, 1, timeout)
            if not ready and due is not None and self.clock.now() >= due:
                self._stalled()
            if rest and ready:
                ready += self.pools.wait(rest, len(rest), 0)[0]
            for ref in ready:
                call = self._calls.pop(ref)
                try:
                    call.results[ref] = self.pools.get(ref)
                except Exception as e:  # the worker raised, or its process died
                    raise WorkerFailure(call.workers[ref], call.shown_step, call.what, error_cause(e)) from e
                if not any(c is call for c in self._calls.values()):
                    self._ready.append(call)
        now = self.clock.now()
        done = [self._complete(call, now) for call in self._ready]
        self._ready = []
        return tie_order(done)

    def _stalled(self) -> None:
        now = self.clock.now()
        for ref, call in self._calls.items():
            if call.deadline is not None and now >= call.deadline:
                raise WorkerFailure(call.workers[ref], call.shown_step, call.what,
                                    f"no answer within {call.deadline - call.start:.0f} s (runtime.watchdog_s): "
                                    f"the worker is stalled")

    def _complete(self, call: _Call, now: float) -> Completion:
        a, at = call.action, self.clock.at
        span = lambda r: Interval(r.worker, at(r.worker, r.start), at(r.worker, r.end))  # noqa: E731 (worker stamps)
        if a is not None and self.observed is not None:
            self.observed.observe(a, now - call.start)
        results = [call.results[r] for r in call.workers]  # launch order: rank 0 first
        if isinstance(a, Generate) and a.more:  # per rank: a tuple of per-part infos, one batch's times
            work = self._by_group([span(r[0]) for r in results])
        elif a is None or not isinstance(a, Publish):
            work = self._by_group([span(r) for r in results])
        else:  # a publish holds ``a.workers`` until every generator has the version (none sent to: no span);
            work = tuple(Interval(w, call.start, now) for w in a.workers) if a.generators else ()
            if a.streamed:  # the senders, free during a streamed one, show their spans of starting the sends
                gens = set(a.generators)
                work += self._by_group([span(r) for r in results if self._group_of.get(r.worker, r.worker) not in gens])
        if isinstance(a, Generate):  # results: one merged info per part of the action, in part order
            if a.more:
                results = [merge_fragment_infos(p, [r[i] for r in results]) for i, p in enumerate(a.fragments)]
            elif len(results) > 1:
                results = [merge_fragment_infos(a.fragment, results)]
            for p, info in zip(a.fragments, results):
                st, g = self._step(p.step), p.group
                st.uids[g] = info.uid
                st.rewards.setdefault(g, {}).update(zip(p.generations, info.rewards))
                for k, v in info.reward_parts.items():
                    st.parts.setdefault(g, {}).setdefault(k, {}).update(zip(p.generations, v))
        elif isinstance(a, Train):
            results = [merge_chunk_results(results)] if len(results) > 1 else results
            self._step(a.chunk.step).cells.extend(results[0].cells)
        elif isinstance(a, Commit):
            if a.final:
                for k in [k for k in self._steps if k <= a.step]:
                    del self._steps[k]
            else:
                self._step(a.step).cells = []
        return Completion(a, call.start, now, work, side=call.side, step=call.step, results=results)

    # ---- checks --------------------------------------------------------------------------------------
    def step_rewards(self, step: int) -> tuple[dict, dict]:
        """(group -> rewards, group -> {reward part -> values}) of the step's complete groups so far, in
        generation order: plain numbers, what the trainers compute advantages and loss scales from."""
        G = self.plan.generations
        st = self._step(step)
        done = sorted(g for g, r in st.rewards.items() if len(r) == G)
        rewards = {g: tuple(st.rewards[g][i] for i in range(G)) for g in done}
        parts = {g: {k: tuple(v[i] for i in range(G)) for k, v in st.parts[g].items()} for g in done if g in st.parts}
        return rewards, parts

    def _check_cells(self, step: int, round: int) -> None:
        st = self._step(step)
        p = self.plan
        want = grid_cells([st.uids.get(g) for g in p.round_groups(round)], p.generations, p.trained_timesteps)
        if len(st.cells) != len(set(st.cells)) or set(st.cells) != want:
            raise WorkerFailure("driver", step_number(step), "the commit check (I2)",
                                f"{len(st.cells)} recorded cells ({len(set(st.cells))} distinct) for a grid of "
                                f"{len(want)} in round {round}")


def merge_fragment_infos(fragment, infos: list):
    """One ``FragmentInfo`` of ``fragment`` from the infos of the ranks that each generated a share of it
    (a sharded pool's collective generation): rewards and reward parts in ``fragment.generations`` order."""
    by_gen, parts = {}, {}
    for info in infos:
        for i, g in enumerate(info.fragment.generations):
            by_gen[g] = info.rewards[i]
            for k, v in info.reward_parts.items():
                parts.setdefault(k, {})[g] = v[i]
    if sum(len(i.fragment.generations) for i in infos) != len(by_gen) or sorted(by_gen) != sorted(fragment.generations):
        raise RuntimeError(f"the ranks generated {sorted(by_gen)} of {fragment} (a generation missing or twice)")
    first = next(i for i in infos if i.fragment.generations)
    return replace(first, fragment=fragment, rewards=tuple(by_gen[g] for g in fragment.generations),
                   reward_parts={k: tuple(v[g] for g in fragment.generations) for k, v in parts.items()},
                   start=min(i.start for i in infos), end=max(i.end for i in infos))


def merge_chunk_results(results: list):
    """One ``ChunkResult`` from the ranks of a shard group that trained one chunk together (each recorded the
    whole chunk's cells; their loss statistics cover their own share and add up)."""
    cells = {r.cells for r in results}
    if len(cells) != 1:
        raise RuntimeError(f"the ranks of a shard group recorded different cells for {results[0].chunk}")
    stats = results[0].stats
    for r in results[1:]:
        stats = stats.add(r.stats)
    return replace(results[0], stats=stats, start=min(r.start for r in results), end=max(r.end for r in results))
