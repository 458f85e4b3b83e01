"""BTS's leaf value with the closed-form training schedule (equal chunks) against the plain greedy list schedule
written out here: the same ticks on random states of random plans."""

import heapq
import random

from digenrl.schedule import Durations, Mode, StepPlan
from digenrl.schedule.bts_model import StepModel, TickModel, _equal_jobs


class _Cost:
    def __init__(self, rng):
        self.k = {op: (rng.uniform(0.0, 2.0), rng.uniform(0.1, 3.0)) for op in
                  ("denoise", "vae_decode", "reward", "transfer", "train_chunk", "allreduce", "optimizer", "publish",
                   "tag_switch")}

    def time(self, op, batch, pool):
        a, b = self.k[op]
        return a + b * batch * (1.3 if pool == "trainer" else 1.0)


def _plain_leaf(tm, st):
    """Rollout: fragments in dispatch order on the earliest-free generator; a group is done at its last end.
    Training: the ready chunks (released at 0), then every done group's chunks in (done, group) order, each
    starting at max(earliest-free rank, release)."""
    nxt, left, gens, ranks, ready = st
    done = {}
    for e, g in list(gens) + [(e, g) for e, grps, _ in ranks for g in grps]:
        if g >= 0:
            done[g] = max(done.get(g, 0), e)
    free = sorted([e for e, _ in gens] + [0] * (tm.n_gen - len(gens)))
    for i in range(nxt, left * tm.F):
        e = heapq.heappop(free) + tm.gen[i % tm.F]
        heapq.heappush(free, e)
        done[i // tm.F] = max(done.get(i // tm.F, 0), e)
    jobs = [(0, c) for rem in ready for c in tm.chunk[tm.C - rem:]]
    for g in sorted(done, key=lambda g: (done[g], g)):
        jobs += [(done[g], c) for c in tm.chunk]
    rf = sorted(e for e, _, _ in ranks)
    for rel, c in jobs:
        heapq.heappush(rf, max(heapq.heappop(rf), rel) + c)
    return max(rf) + tm.commit


def _state(rng, tm):
    left = rng.randint(1, tm.P)
    nxt = rng.randint(0, left * tm.F)
    gens = tuple(sorted((rng.randint(0, 40), rng.choice([-1] + list(range(left))))
                        for _ in range(rng.randint(0, tm.n_gen))))
    # a rank's in-flight TAG action: none, or a gang over one or several consecutive groups
    spans = [(), ()] + [tuple(range(g, min(left, g + n))) for g in range(left) for n in (1, 2)]
    ranks = tuple(sorted((rng.choice([0, rng.randint(1, 60)]), rng.choice(spans), rng.randint(0, 1))
                         for _ in range(tm.n_rank)))
    ready = tuple(rng.randint(1, tm.C) for _ in range(rng.randint(0, 3)))
    return nxt, left, gens, ranks, ready


def test_equal_jobs_is_the_greedy_schedule():
    rng = random.Random(3)
    for _ in range(3000):
        free = sorted(rng.randint(0, 50) for _ in range(rng.randint(1, 6)))
        n, c, rel = rng.randint(0, 40), rng.randint(1, 9), rng.randint(0, 60)
        want = list(free)
        heapq.heapify(want)
        for _ in range(n):
            heapq.heappush(want, max(heapq.heappop(want), rel) + c)
        got = list(free)
        _equal_jobs(got, n, c, rel)
        assert got == sorted(got)
        if n:  # ranks that took no job may keep a free tick below the release: only the busy ones are compared
            assert max(got) == max(want) and sorted(max(e, rel) for e in want) == [max(e, rel) for e in got]
        else:
            assert got == free


def test_leaf_matches_the_plain_list_schedules():
    rng = random.Random(11)
    uniform = 0
    for _ in range(150):
        G = rng.choice([2, 3, 4, 6])
        S = rng.choice([1, 2, 3])
        plan = StepPlan(rng.randint(1, 5), G, rng.randint(1, G), S, S + 1, rng.randint(1, G), rng.randint(1, S),
                        tuple(f"g{i}" for i in range(rng.randint(1, 3))), tuple(f"t{i}" for i in range(rng.randint(1, 4))),
                        Mode.GAP_TSP_TAG, 3)
        tm = TickModel(StepModel(plan, Durations(plan, _Cost(rng))), rng.uniform(0.2, 2.0))
        uniform += tm._uniform is not None
        for _ in range(40):
            st = _state(rng, tm)
            assert tm.leaf(st) == _plain_leaf(tm, st), (plan, st)
    assert 20 < uniform < 150  # both the closed form and the heap path are exercised
