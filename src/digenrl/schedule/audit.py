"""Check a finished run against the invariants of docs/architecture.md from its action log and events alone.

Independent of the scheduler's internals: it replays what was emitted ((start time, action) pairs) and what
was reported (events with end times), so it can audit a simulated run or a real runtime trace.

Checked: every fragment of every step generated exactly once and the fragments of a group partition its
generations; each worker runs one action at a time; generators use the newest published version and TAG uses
the trainers' current version (I3); staleness <= 1, only ``full`` is stale, stale share <= cap (I4); each
(generation, trained timestep) cell of a step trained exactly once, after its group's rewards are in, after
the previous commit, before its own commit (I2, I3); commits and publishes in order, one publish per step.
With minibatches (``plan.rounds`` > 1 commits per step) a cell is trained once per epoch, in the round of its
group's minibatch, with the weights after the previous round's commit; TAG only before the step's first commit.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Sequence

from .actions import Action, ChunkTrained, Commit, Committed, FragmentGenerated, Generate, Publish, Published
from .actions import Train
from .plan import StepPlan


def audit(plan: StepPlan, log: Sequence[tuple[float, Action]], events: Iterable, first_step: int = 0) -> list[str]:
    """Violations found (empty list: the run is consistent). ``first_step``: the run started with that many
    steps committed and published (a resumed or recovered run)."""
    bad: list[str] = []
    eps = 1e-9
    events = list(events)
    frag_end = {e.fragment: e.time for e in events if isinstance(e, FragmentGenerated)}
    chunk_end = {}
    for e in events:
        if isinstance(e, ChunkTrained):
            chunk_end[(e.chunk, e.rank)] = e.time
    commit_end = {(e.step, e.round): e.time for e in events if isinstance(e, Committed)}
    R = plan.rounds
    publish_end = {e.version: e.time for e in events if isinstance(e, Published)}
    commit_start: dict[tuple[int, int], float] = {}
    busy: dict[str, list[tuple[float, float]]] = defaultdict(list)
    gens_of: dict[tuple[int, int], list[int]] = defaultdict(list)
    versions: dict[tuple[int, int, int], int] = {}
    cells: dict[tuple[int, int, int, int, int], int] = defaultdict(int)  # (step, round, group, gen, timestep)
    stale: dict[int, int] = defaultdict(int)
    seen_frag: set = set()

    group_done: dict[tuple[int, int], float] = {}
    for _, a in log:
        if isinstance(a, Generate):
            key = (a.fragment.step, a.fragment.group)
            end = frag_end.get(a.fragment, float("inf"))
            group_done[key] = max(group_done.get(key, end), end)

    def published_at(t: float) -> int:
        return max([first_step] + [v for v, te in publish_end.items() if te <= t + eps])

    def commits_at(t: float) -> int:
        """Optimizer steps done by ``t`` (rounds of every step)."""
        return first_step * R + sum(1 for te in commit_end.values() if te <= t + eps)

    def committed_at(t: float) -> int:
        """The trainers' version at ``t``: steps whose last round committed."""
        return commits_at(t) // R

    for t, a in log:
        if isinstance(a, Generate):
            f = a.fragment
            if f in seen_frag:
                bad.append(f"fragment {f} generated twice")
            seen_frag.add(f)
            end = frag_end.get(f)
            if end is None:
                bad.append(f"fragment {f} never reported generated")
                continue
            busy[a.worker].append((t, end))
            gens_of[(f.step, f.group)].extend(f.generations)
            for i in f.generations:
                versions[(f.step, f.group, i)] = a.version
            if a.version not in (f.step, f.step - 1) or a.version < 0:
                bad.append(f"I4: fragment {f} generated with version {a.version} (staleness > 1)")
            if a.version == f.step - 1:
                stale[f.step] += f.size
                if not plan.mode.tcss:
                    bad.append(f"I4: stale fragment {f} in non-TCSS mode {plan.mode.value}")
            if a.tag:
                if not plan.is_trainer(a.worker):
                    bad.append(f"TAG fragment {f} on non-trainer {a.worker}")
                if a.version != f.step or commits_at(t) != f.step * R:
                    bad.append(f"I3: TAG fragment {f} uses version {a.version}, trainers hold {committed_at(t)} "
                               f"after {commits_at(t)} commits")
            elif plan.mode.disaggregated:
                if plan.is_trainer(a.worker):
                    bad.append(f"non-TAG fragment {f} on trainer {a.worker}")
                if a.version != published_at(t):
                    bad.append(f"fragment {f} uses version {a.version}, generators hold {published_at(t)}")
            elif a.version != committed_at(t):
                bad.append(f"colocated fragment {f} uses version {a.version}, weights are {committed_at(t)}")
        elif isinstance(a, Train):
            c = a.chunk
            end = chunk_end.get((c, a.rank))
            if end is None:
                bad.append(f"chunk {c} on {a.rank} never reported trained")
                continue
            busy[a.rank].append((t, end))
            if commits_at(t) != c.step * R + c.round:
                bad.append(f"chunk {c} trained after {commits_at(t)} commits (round {c.round} of step {c.step})")
            if c.group not in plan.round_groups(c.round):
                bad.append(f"chunk {c}: group {c.group} is not in the minibatch of round {c.round}")
            group_gens = sorted(gens_of[(c.step, c.group)])
            if group_gens != list(range(plan.generations)) or group_done[(c.step, c.group)] > t + eps:
                bad.append(f"I3: chunk {c} trained at {t} before its group's rewards were in")
            for i, j in c.cells:
                cells[(c.step, c.round, c.group, i, j)] += 1
                if versions.get((c.step, c.group, i), -9) not in (c.step, c.step - 1):
                    bad.append(f"I4: cell {(i, j)} of {c.step}/{c.group} from version "
                               f"{versions.get((c.step, c.group, i))}")
        elif isinstance(a, Commit):
            key = (a.step, a.round)
            if key in commit_start:
                bad.append(f"round {a.round} of step {a.step} committed twice")
            if a.final != (a.round == R - 1):
                bad.append(f"commit of round {a.round} of step {a.step} has final={a.final}")
            commit_start[key] = t
            for r in a.ranks:
                busy[r].append((t, commit_end.get(key, t)))
        elif isinstance(a, Publish):
            for r in a.ranks:
                busy[r].append((t, publish_end.get(a.version, t)))
    order = [(k, r) for k in range(first_step, plan.steps) for r in range(R)]
    for prev, key in zip([None] + order, order):
        if key not in commit_start or key not in commit_end:
            bad.append(f"round {key[1]} of step {key[0]} never committed")
        elif prev in commit_end and commit_start[key] < commit_end[prev] - eps:
            bad.append(f"round {key[1]} of step {key[0]} committed before round {prev[1]} of step {prev[0]}")
    for k in range(first_step, plan.steps):
        if k + 1 not in publish_end:
            bad.append(f"version {k + 1} never published")
        for g in range(plan.prompts):
            if sorted(gens_of[(k, g)]) != list(range(plan.generations)):
                bad.append(f"step {k} group {g}: generations {sorted(gens_of[(k, g)])} not generated once each")
            for r in range(R):
                want = 1 if g in plan.round_groups(r) else 0
                for i in range(plan.generations):
                    for j in range(plan.trained_timesteps):
                        n = cells.get((k, r, g, i, j), 0)
                        if n != want:
                            bad.append(f"I2: cell ({i},{j}) of step {k} group {g} trained {n} times in round {r}")
        if stale[k] > plan.stale_cap:
            bad.append(f"I4: step {k} has {stale[k]} stale trajectories > cap {plan.stale_cap}")
    for (c, r), te in chunk_end.items():
        key = (c.step, c.round)
        if key in commit_start and te > commit_start[key] + eps:
            bad.append(f"I2: chunk {c} ended after its commit started")
    for w, iv in busy.items():
        iv.sort()
        for (s0, e0), (s1, e1) in zip(iv, iv[1:]):
            if s1 < e0 - eps:
                bad.append(f"worker {w} runs two actions at once ({s0}-{e0} and {s1}-{e1})")
                break
    return bad
