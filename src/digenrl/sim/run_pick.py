"""What the planner's search (``sim.planner.search``) picks once its probes are run: the plan at the run's length,
then its stale hold.

The pick at the run's length (``run_steps`` = K, given where the plan is then simulated for K steps:
``sim.scenario.run_mode``, i.e. ``digenrl simulate`` on a preset and the benchmarks). A probe's steady figure is not
the run's: the run reports makespan / K (``RunResult.step_time``), the first step's pipeline fill and the last step
included, and under TCSS a short probe's steps are not yet the steady ones (the fill banks next-step fragments that
the next steps spend, the period of the stale pattern can be 2 or 3 steps, and the last step has no next step to
feed). Wan2.1-T2V-14B on testbed B, ``full``, split 8+24: fragment 3 with 3 shard groups probes 645.7 s at 8 steps
and fragment 1 with one group 657.2 s, but over 20 steps they run 678.5 s and 656.2 s (first publish at 921 s vs 684
s; from step 2 the intervals repeat 737, 553, 742 s vs 684, 622 s). So the probes steer the search (which candidates
it looks at, and its descent), and the pick is made on the run's own figure: over C, every candidate the search
looked at (the probes of the unpruned search; a pruned search's probes and the candidates it pruned), the plan with
the least makespan / K simulated for K steps (``sim.executor.run_step_time``; ties: the earlier candidate). Exact
with pruning: the stage-1 pick is simulated first; a candidate whose run floor

    (first_publish_floor + (K - 1) step_time_floor) / K     (its plan at K steps; ``sim.plan_bound.run_step_floor``)

is above the best run so far is not simulated (makespan >= t_pub(K) = t_pub(1) + (t_pub(K) - t_pub(1))), and a
run is stopped once its time passes the best's makespan. The pick, its probe and its run figure are those of the
unpruned search (a pick the pruned search had skipped is probed, uncapped); the stale hold (below) is then chosen
by the same run figure. Without ``run_steps`` (``digenrl plan``, which plans for a run of any length, and
``digenrl simulate --config --search``, which runs what ``digenrl plan`` writes) the pick is the fastest
probe.
"""

from __future__ import annotations

from dataclasses import replace

from ..schedule import stale_hold as stale_rule

# ``tuning.stale_hold`` values tried on the chosen ``full`` plan with a joined publish (besides 0): a hold only
# against a long overrun (0.5), and one that holds unless the generator would wait over 4x the overrun (4).
STALE_HOLDS = (0.5, 4.0)


def at_run_length(s, first, steps: int):
    """``s``: the search's memo of builds, probes and runs (``sim.planner._Search``). The candidate of least makespan / K at the run's length among those the search looked at (module
    docstring), starting from the fastest probe ``first``; its probe."""
    looked = [c for c in sorted(s.order, key=s.order.get) if not isinstance(s.get(c), str)]
    best_c, best_t = first.candidate, s.run(first.candidate, steps)
    if s.prune:  # lowest run floor first (the order only saves runs: the pick is the least (figure, order))
        looked = sorted(looked, key=lambda c: (s.run_floor(c, steps), s.order[c]))
    for c in looked:
        if c == best_c:
            continue
        t = s.run(c, steps, best_t)
        if t is not None and (t, s.order[c]) < (best_t, s.order[best_c]):
            best_c, best_t = c, t
    return s.seen.get(best_c) or s.probe(best_c)


def choose_stale_hold(s, res) -> None:
    """``s``: the search's memo; ``res``: its ``SearchResult``, whose pick this sets. The fastest h of (0,) + ``STALE_HOLDS`` on the chosen plan (``full`` with a joined publish; by the run's
    figure where the pick was made at the run's length), ties to the smaller; the plan's own h stays where the
    rule does not apply. Each h is a candidate of the source, built and probed as any other (so the chosen one has
    the source's config)."""
    best = res.best
    if not stale_rule.applies(replace(best.plan, stale_hold=1.0)):
        return
    probes = {h: s.probe(replace(best.candidate, stale_hold=h)) for h in (0.0,) + STALE_HOLDS}
    if res.run_steps is None:
        res.holds_s = {h: p.step_time for h, p in probes.items() if p is not None}
    else:  # at the run's length, as the pick (module docstring)
        res.holds_s = {h: t for h, p in probes.items()
                       if p is not None and (t := s.run(p.candidate, res.run_steps)) is not None}
    h = min(res.holds_s, key=lambda x: (res.holds_s[x], x))
    res.best = probes[h]
    res.costs[res.best.candidate] = s.built[res.best.candidate][0]
    if res.best not in res.probes:
        res.probes.append(res.best)
