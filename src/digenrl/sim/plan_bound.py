"""A lower bound on a probe's steady step time, from the plan and the cost model alone (no simulation).

``digenrl plan`` uses it to skip a candidate that cannot beat one already probed (``sim.planner``): the
bound is never above the simulated figure, so a skipped candidate is strictly slower and the search returns
the plan, the step time and the per-split bests of the exhaustive search.

The figure bounded is the probe's steady step time L / (K - 1), L = t_pub(K) - t_pub(1) (first publish to last,
K = ``plan.steps``). Durations d are those the executor charges (``Durations(plan, cost)``, no jitter); N_t
scheduler trainers (a shard group is one), N_g generators, R = ``plan.rounds`` commits of C = d.commit() per
step, a publish of Pb = d.publish(), W = P x G generations per step. Facts of the scheduler used:

* a trainer worker runs one action at a time; a commit and a publish occupy every trainer worker, and the
  commits of step k start after publish k ends (``_collective``), so [t_pub(1), t_pub(K)] holds every trainer
  worker's (K - 1)(R C + Pb) seconds of collectives; a streamed publish (``plan.publish_streams``) occupies
  no trainer worker, its sends are in the final commit: (K - 1)((R - 1) C + C_final);
* a publish the generators join (``plan.publish_joins``) holds every generator: the window holds each
  generator's (K - 1) Pb seconds of publishes besides its generation;
* a step's chunks exist only after the previous step's final commit and are trained before its own, so the
  window holds the training of steps 2 .. K-1, and of step 1 too unless a joined publish lets a free rank
  train during the wait (``plan.publish_joins``): T = sum of d.train over one step's chunks, every round;
* a fragment of step k is dispatched once version k - 1 (TCSS, stale) or k is published and done before step
  k's commit: the window holds the generation of steps 2 .. K-1 (and of step 1 outside TCSS). On a
  generator one generation costs at least a_g = min over the plan's fragment sizes s of d.generate(s) / s;
  on a trainer rank (TAG, colocated) at least a_t = min over n in 1..G, with or without a switch, of
  d.generate_on_trainer(n) / n, n up to max(G, shard ranks x fragment size) (a gang merges up to one fragment
  per rank of a shard group, of one or several groups).

Work bound (every mode): with n_w generations in the window split as x on the trainers and n_w - x on the
generators,

    L >= min_x max( (K-1)(R C + Pb) + ((K - k_lo) T + x a_t) / N_t,  (n_w - x) a_g / N_g [+ (K-1) Pb, joined] )

(x = 0 without TAG, x = n_w colocated): the larger of the two when the trainer side alone is the larger at
x = 0, else the crossing A + b (D - A) / (b + e) with A, D the two sides at x = 0 and b = a_t / N_t,
e = a_g / N_g.

Step bound (outside TCSS): all of step k's work lies in [t_pub(k), t_pub(k+1)] (the first publish's argument
below, from t_pub(k) on, plus the publish): with r = N_g / a_g + N_t / a_t (trainer ranks count only where they
generate; no worker completes more than x / a generations in x seconds), its last generation ends no earlier
than W / r after t_pub(k), and after it the last group's chunks (all its rounds: at least
min_g T_g / N_t), the final commit and the publish follow; and no chunk of the step starts before a first group
of G generations exists (G / r after t_pub(k)), after which the trainer worker with the most of the step's chunk
seconds (at least their mean T / N_t; one action at a time) trains them, and every trainer worker runs the R - 1
round commits (each after its round's chunks), all before the final commit, which the publish follows:

    t_pub(k+1) - t_pub(k) >= max(W / r + min_g T_g / N_t,  G / r + T / N_t + (R - 1) C) + d.commit(final) + Pb

(whatever the schedule: only the rate bound, the order chunk -> commit -> publish and one action per worker are
used). The mean of the K - 1 intervals is at least that.

First publish (every mode): nothing precedes step 1, so all of its work lies in [0, t_pub(1)]. With
r = N_g / a_g + N_t / a_t (trainer ranks count only where they generate), its last generation ends no earlier
than W / r, and after it the last group's chunks (at least min_g T_g / N_t) and the final commit follow; and no
chunk starts before a first group of G generations exists (G / r), after which every trainer worker's share of
the step's chunks and its R - 1 round commits come before the final commit:

    t_pub(1) >= max(W / r + min_g T_g / N_t,  G / r + T / N_t + (R - 1) C) + d.commit(final)

(``first_publish_floor``). With the steady bound it bounds a K-step run's makespan / K, the figure of the
planner's pick at a run's length: makespan >= t_pub(K) = t_pub(1) + L, so

    makespan / K >= (first_publish_floor + (K - 1) step_time_floor) / K        (``run_step_floor``).

Floating point: the simulator sums the same durations in another order; the bound is scaled by
(1 - 1e-9) so rounding never puts it above the simulated figure.
"""

from __future__ import annotations

from functools import cached_property

from ..schedule import CostModel, Durations, StepPlan
from ..schedule.layout import classic_chunks, step_fragments, tsp_chunks

SAFETY = 1.0 - 1e-9


def _chunk_times(plan: StepPlan, d: Durations) -> dict[int, float]:
    """group -> seconds of its chunks over all rounds of one step (what the executor charges)."""
    out = {g: 0.0 for g in range(plan.prompts)}
    for r in range(plan.rounds):
        for g in plan.round_groups(r):
            chunks = (tsp_chunks(plan, 0, g, r) if plan.mode.tsp
                      else [c for cs in classic_chunks(plan, 0, g, r).values() for c in cs])
            out[g] += sum(d.train(c.size) for c in chunks)
    return out


def _per_generation(d: Durations, sizes, on_trainer: bool, switches) -> float:
    """min over ``sizes`` (and switch or not) of d.generate(n) / n; a size the cost model refuses is left out (a run
    that generated it would fail the same way)."""
    best = float("inf")
    for n in sizes:
        for sw in switches:
            try:
                best = min(best, d.generate(n, on_trainer, sw) / n)
            except ValueError:
                continue
    return best


class Priced:
    """What the floors read of a plan and its ``Durations``, at any run length (``plan.steps`` is read by none of
    it): the per-generation floors a_g and a_t, every group's chunk seconds, a commit and a publish (each priced
    on first use, in the order the floors read them). The planner prices a candidate once for its probe's floor
    and its run's (``priced=``)."""

    def __init__(self, plan: StepPlan, d: Durations):
        mode = plan.mode
        self.plan, self.d = plan, d
        self.n_t, self.n_g = len(plan.trainers), len(plan.generators)
        n_g = self.n_g
        a_g = _per_generation(d, {f.size for f in step_fragments(plan, 0)}, False, (False,)) if n_g else float("inf")
        on_trainer = (not mode.disaggregated) or mode.tag
        top = max(plan.generations, plan.shard_ranks * plan.fragment_size)  # a gang: up to one fragment per rank
        a_t = _per_generation(d, range(1, top + 1), True, (False, True)) if on_trainer else float("inf")
        # nothing priced: no bound
        self.none = bool((n_g and a_g == float("inf")) or (not mode.disaggregated and a_t == float("inf")))
        self.a_g, self.a_t, self.on_trainer = a_g, a_t, on_trainer and a_t < float("inf")

    @cached_property
    def per_group(self) -> dict[int, float]:
        return _chunk_times(self.plan, self.d)

    @cached_property
    def commit(self) -> float:
        return self.d.commit()

    @cached_property
    def commit_final(self) -> float:
        return self.d.commit(final=True)

    @cached_property
    def publish(self) -> float:
        return self.d.publish()

    def rate(self) -> float:
        """r = N_g / a_g + N_t / a_t, trainer ranks counted only where they generate (module docstring)."""
        n_t, n_g, a_g, a_t = self.n_t, self.n_g, self.a_g, self.a_t
        rates = ([n_g / a_g if a_g > 0 else float("inf")] if n_g else []) + (
            [n_t / a_t if a_t > 0 else float("inf")] if self.on_trainer else [])
        return sum(rates)


def step_time_floor(plan: StepPlan, cost: CostModel, priced: Priced | None = None) -> float:
    """A lower bound on ``simulate(plan, cost)``'s steady step time (module docstring); 0 below 3 steps.
    ``priced``: ``Priced`` of ``plan`` at any length and ``cost`` (else priced here)."""
    if plan.steps < 3:
        return 0.0
    return _step_time_floor(plan, priced or Priced(plan, Durations(plan, cost)))


def _step_time_floor(plan: StepPlan, p: Priced) -> float:
    """``step_time_floor`` from ``p`` (``Priced`` of ``plan`` and the cost model)."""
    K = plan.steps
    if K < 3:
        return 0.0
    mode = plan.mode
    n_t, n_g = p.n_t, p.n_g
    W = plan.batch
    per_group = p.per_group
    T = sum(per_group.values())
    coll = (plan.rounds - 1) * p.commit + p.commit_final + (0.0 if plan.publish_streams else p.publish)
    if p.none:
        return 0.0  # nothing priced: no bound
    a_g, a_t, on_trainer = p.a_g, p.a_t, p.on_trainer
    k_lo = 2 if plan.publish_joins else 1
    n_w = (K - 2 if mode.tcss else K - 1) * W
    # work bound over the window (K - 1 intervals)
    A = (K - 1) * coll + (K - k_lo) * T / n_t
    if not mode.disaggregated:
        L = A + n_w * a_t / n_t
    else:
        D = n_w * a_g / n_g + ((K - 1) * p.publish if plan.publish_joins else 0.0)
        if A >= D or not on_trainer:
            L = max(A, D)
        else:
            b, e = a_t / n_t, a_g / n_g
            L = A + b * (D - A) / (b + e)
    bound = L / (K - 1)
    if not mode.tcss:  # step bound: one interval holds all of its step's work (module docstring)
        # t_pub(k+1) - t_pub(k) >= max(W / r + min_g T_g / N_t, G / r + T / N_t + (R - 1) C) + C_final + Pb
        rate = p.rate()
        last = W / rate + min(per_group.values()) / n_t
        first = plan.generations / rate + T / n_t + (plan.rounds - 1) * p.commit
        bound = max(bound, max(last, first) + p.commit_final + p.publish)
    return bound * SAFETY


def first_publish_floor(plan: StepPlan, cost: CostModel, priced: Priced | None = None) -> float:
    """A lower bound on the first publish time t_pub(1) of ``simulate(plan, cost)`` (module docstring); 0 where
    nothing is priced. ``priced``: as ``step_time_floor``'s."""
    return _first_publish_floor(plan, priced or Priced(plan, Durations(plan, cost)))


def _first_publish_floor(plan: StepPlan, p: Priced) -> float:
    """``first_publish_floor`` from ``p`` (``Priced`` of ``plan`` and the cost model)."""
    if p.none:
        return 0.0
    rate = p.rate()
    per_group, n_t = p.per_group, p.n_t
    last = plan.batch / rate + min(per_group.values()) / n_t
    first = plan.generations / rate + sum(per_group.values()) / n_t + (plan.rounds - 1) * p.commit
    return (max(last, first) + p.commit_final) * SAFETY


def run_step_floor(plan: StepPlan, cost: CostModel, priced: Priced | None = None) -> float:
    """A lower bound on ``simulate(plan, cost).step_time`` (makespan / K, K = ``plan.steps``; module docstring).
    ``priced``: as ``step_time_floor``'s."""
    K = plan.steps
    if K < 1:
        return 0.0
    p = priced or Priced(plan, Durations(plan, cost))  # one pricing for both floors
    steady = _step_time_floor(plan, p) if K >= 3 else 0.0
    return (_first_publish_floor(plan, p) + (K - 1) * steady) / K


__all__ = ["Priced", "first_publish_floor", "run_step_floor", "step_time_floor"]
