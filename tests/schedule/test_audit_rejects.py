"""The audit (``schedule.audit``) is the oracle of I2-I4: it must reject a bad log, one test per rule it checks.

Each bad log is a good simulated log (``sim.executor.simulate``, which the audit accepts) corrupted minimally:
one action or event changed, dropped, duplicated or moved. Each test asserts the exact violation message of the
rule it breaks, so a weakened rule (``n != want`` -> ``n < want``, a dropped clause) fails the test.
"""

from __future__ import annotations

from dataclasses import replace

from digenrl.schedule import BTSConfig, ChunkTrained, Commit, Committed, FragmentGenerated, Generate, Publish, Published, Train
from digenrl.schedule.audit import audit
from digenrl.schedule.layout import Fragment
from digenrl.sim.executor import simulate
from sched_helpers import LinCost, make_plan

COST = LinCost({"denoise": (0.1, 0.05), "train_chunk": (0.2, 0.1), "allreduce": (0.1, 0), "optimizer": (0.1, 0),
                "publish": (0.2, 0), "reward": (0.05, 0.01)})
# Generate(n) = 2 n s, Train(c) = 0.5 c s, Commit 0.3 s, Publish 0.2 s, TAG switch 0.1 s
HAND = LinCost({"denoise": (0.0, 1.0), "train_chunk": (0.0, 0.5), "allreduce": (0.2, 0), "optimizer": (0.1, 0),
                "publish": (0.2, 0), "tag_switch": (0.1, 0)})


def good(mode, cost=COST, **kw):
    """A plan and its simulated (log, events), which the audit accepts."""
    plan = make_plan(mode, **kw)
    res = simulate(plan, cost)
    log, events = list(res.actions), list(res.events)
    assert audit(plan, log, events) == []
    return plan, log, events


def index(seq, pred, nth=0):
    hits = [i for i, x in enumerate(seq) if pred(x)]
    return hits[nth]


def gen_at(log, step, group, gens, worker=None):
    """Index of the Generate of fragment (step, group, gens) [on worker]."""
    return index(log, lambda ta: isinstance(ta[1], Generate) and ta[1].fragment == Fragment(step, group, gens)
                 and (worker is None or ta[1].worker == worker))


def frag_event(events, fragment):
    return index(events, lambda e: isinstance(e, FragmentGenerated) and e.fragment == fragment)


def train_at(log, pred, nth=0):
    return index(log, lambda ta: isinstance(ta[1], Train) and pred(ta[1]), nth)


def replace_chunk(log, events, i, **changes):
    """Change the chunk of the Train at log[i] and of its ChunkTrained event alike."""
    t, a = log[i]
    new = replace(a.chunk, **changes)
    j = index(events, lambda e: isinstance(e, ChunkTrained) and e.chunk == a.chunk and e.rank == a.rank)
    log[i] = (t, replace(a, chunk=new))
    events[j] = replace(events[j], chunk=new)
    return new


def rejects(plan, log, events, expected, first_step=0):
    bad = audit(plan, log, events, first_step=first_step)
    assert expected in bad, bad
    return bad


def named(x):
    """A fragment, a chunk or a gang's parts as the audit's messages write them: the step numbered from 1, as every
    step a person reads (``schedule.step_number``)."""
    if isinstance(x, tuple):
        return "[" + ", ".join(named(p) for p in x) + "]"
    what = f"round {x.round}, cells {list(x.cells)}" if hasattr(x, "cells") else f"generations {list(x.generations)}"
    return f"(step {x.step + 1}, group {x.group}, {what})"


def test_the_good_logs_pass_in_every_mode():
    for mode in ("colocated", "naive", "gap", "gap_tsp", "gap_tsp_tag", "full"):
        good(mode, steps=3)
        good(mode, prompts=4, minibatches=2, epochs=2)


# ---- I2: every cell trained exactly once per round ---------------------------------------------------------


def test_cell_trained_twice():
    plan, log, events = good("gap_tsp")
    i = train_at(log, lambda a: a.chunk.step == 0 and a.chunk.group == 0)
    j = train_at(log, lambda a: a.chunk.step == 0 and a.chunk.group == 0, nth=1)
    extra = log[j][1].chunk.cells[0]
    replace_chunk(log, events, i, cells=log[i][1].chunk.cells + (extra,))
    bad = rejects(plan, log, events, f"I2: cell ({extra[0]},{extra[1]}) of step 1 group 0 trained 2 times in round 0")
    assert len(bad) == 1  # nothing else is wrong with it


def test_cell_never_trained():
    plan, log, events = good("gap_tsp")
    i = train_at(log, lambda a: a.chunk.step == 1 and a.chunk.group == 1)
    cells = log[i][1].chunk.cells
    replace_chunk(log, events, i, cells=cells[1:])
    bad = rejects(plan, log, events, f"I2: cell ({cells[0][0]},{cells[0][1]}) of step 2 group 1 trained 0 times in round 0")
    assert len(bad) == 1


def test_cell_trained_in_the_wrong_round():
    # M = 2: group 0 is minibatch 0 (round 0), group 1 minibatch 1 (round 1); a round-0 chunk relabelled group 1
    plan, log, events = good("gap", prompts=2, minibatches=2)
    i = train_at(log, lambda a: a.chunk.step == 0 and a.chunk.round == 0)
    c = replace_chunk(log, events, i, group=1)
    bad = rejects(plan, log, events, f"chunk {named(c)}: group 1 is not in the minibatch of round 0")
    i0, j0 = c.cells[0]
    assert f"I2: cell ({i0},{j0}) of step 1 group 1 trained 1 times in round 0" in bad
    assert f"I2: cell ({i0},{j0}) of step 1 group 0 trained 0 times in round 0" in bad


def test_chunk_trained_in_a_later_round_than_the_commits_done():
    plan, log, events = good("gap", prompts=2, minibatches=2)
    i = train_at(log, lambda a: a.chunk.step == 0 and a.chunk.round == 0)
    c = replace_chunk(log, events, i, round=1)
    rejects(plan, log, events, f"chunk {named(c)} trained after 0 commits (round 1 of step 1)")


def test_chunk_ending_after_its_commit_started():
    plan, log, events = good("gap_tsp")
    ci = index(log, lambda ta: isinstance(ta[1], Commit) and ta[1].step == 0)
    t_commit = log[ci][0]
    j = max((k for k, e in enumerate(events) if isinstance(e, ChunkTrained) and e.chunk.step == 0),
            key=lambda k: events[k].time)  # step 0's last chunk
    events[j] = replace(events[j], time=t_commit + 0.05)
    rejects(plan, log, events, f"I2: chunk {named(events[j].chunk)} ended after its commit started")


def test_chunk_never_reported_trained():
    plan, log, events = good("gap_tsp")
    j = index(events, lambda e: isinstance(e, ChunkTrained))
    e = events.pop(j)
    rejects(plan, log, events, f"chunk {named(e.chunk)} on {e.rank} never reported trained")


# ---- I3: rewards before training, weights of the right version ------------------------------------------------


def test_chunk_trained_before_its_groups_rewards():
    # gap_tsp_tag, 2 generators: step 0 group 0 is generated on g0 and g1 and trained from the moment both end;
    # one of its fragments reporting later than the first chunk's start is a chunk trained before its rewards
    plan, log, events = good("gap_tsp_tag")
    i = train_at(log, lambda a: a.chunk.step == 0 and a.chunk.group == 0)
    t_train, a = log[i]
    j = frag_event(events, Fragment(0, 0, (0, 1)))
    assert events[j].time <= t_train
    events[j] = replace(events[j], time=t_train + 0.1)  # g0 is idle until its step-1 fragment: no overlap
    bad = rejects(plan, log, events, f"I3: chunk {named(a.chunk)} trained at {t_train} before its group's rewards were in")
    assert all(m.startswith("I3: chunk") for m in bad), bad


def test_chunk_trained_before_its_group_is_generated():
    plan, log, events = good("gap_tsp")
    i = train_at(log, lambda a: a.chunk.step == 0 and a.chunk.group == 1)
    t_train, a = log[i]
    g = gen_at(log, 0, 1, (2, 3))
    moved = log.pop(g)
    log.append(moved)  # the log lists the Generate after the Train (its times are unchanged)
    rejects(plan, log, events, f"I3: chunk {named(a.chunk)} trained at {t_train} before its group's rewards were in")


def test_tag_after_a_minibatch_commit():
    # 1 slow generator, M = 2: after round 0's commit the trainers' weights are no longer the published version,
    # so a trainer idle then may not generate (TAG) the rest of the step
    plan, log, events = good("gap_tsp_tag", cost=HAND, prompts=4, generations=2, fragment_size=1, S=1, T=2, cg=1,
                             cs=1, n_gen=1, n_train=2, steps=1, minibatches=2)
    t_commit = next(t for t, a in log if isinstance(a, Commit))
    g = index(log, lambda ta: isinstance(ta[1], Generate) and ta[0] > t_commit)
    t, a = log[g]
    f = a.fragment
    log[g] = (t, replace(a, worker="t1", tag=True, switch=True))
    j = frag_event(events, f)
    events[j] = replace(events[j], worker="t1")
    bad = rejects(plan, log, events, f"I3: TAG fragment {named(f)} uses version 0, trainers hold 0 after 1 commits")
    assert len(bad) == 1, bad


def test_tag_fragment_of_the_wrong_version():
    plan, log, events = good("gap_tsp_tag", steps=2)
    g = index(log, lambda ta: isinstance(ta[1], Generate) and ta[1].tag and ta[1].fragment.step == 1)
    t, a = log[g]
    log[g] = (t, replace(a, version=0))
    rejects(plan, log, events, f"I3: TAG fragment {named(a.fragment)} uses version 0, trainers hold 1 after 1 commits")


def test_generator_ahead_of_the_published_version():
    # TCSS: step 2's first fragments are generated with version 1 (stale) before version 2 is published
    plan, log, events = good("full", steps=3)
    g = index(log, lambda ta: isinstance(ta[1], Generate) and ta[1].fragment.step == 2 and ta[1].version == 1)
    t, a = log[g]
    log[g] = (t, replace(a, version=2))
    bad = rejects(plan, log, events, f"fragment {named(a.fragment)} uses version 2, generators hold 1")
    assert len(bad) == 1, bad


def test_colocated_fragment_of_old_weights():
    plan, log, events = good("colocated")
    g = gen_at(log, 1, 0, (0, 1))
    t, a = log[g]
    log[g] = (t, replace(a, version=0))
    bad = rejects(plan, log, events, f"colocated fragment {named(a.fragment)} uses version 0, weights are 1")
    assert f"I4: stale fragment {named(a.fragment)} in non-TCSS mode colocated" in bad


def test_tag_on_a_generator():
    plan, log, events = good("gap_tsp_tag")
    g = index(log, lambda ta: isinstance(ta[1], Generate) and not ta[1].tag)
    t, a = log[g]
    log[g] = (t, replace(a, tag=True))
    bad = rejects(plan, log, events, f"TAG fragment {named(a.fragment)} on non-trainer {a.worker}")
    assert len(bad) == 1, bad


def test_non_tag_fragment_on_a_trainer():
    plan, log, events = good("gap_tsp_tag")
    g = index(log, lambda ta: isinstance(ta[1], Generate) and ta[1].tag)
    t, a = log[g]
    log[g] = (t, replace(a, tag=False))
    bad = rejects(plan, log, events, f"non-TAG fragment {named(a.fragment)} on trainer {a.worker}")
    assert len(bad) == 1, bad


# ---- I4: bounded staleness -----------------------------------------------------------------------------------


def test_stale_fragment_in_a_non_tcss_mode():
    plan, log, events = good("gap_tsp")
    g = gen_at(log, 1, 0, (0, 1))
    t, a = log[g]
    log[g] = (t, replace(a, version=0))
    bad = rejects(plan, log, events, f"I4: stale fragment {named(a.fragment)} in non-TCSS mode gap_tsp")
    assert f"fragment {named(a.fragment)} uses version 0, generators hold 1" in bad


def test_staleness_above_one():
    plan, log, events = good("full", steps=3)
    g = index(log, lambda ta: isinstance(ta[1], Generate) and ta[1].fragment.step == 2 and ta[1].version == 1)
    t, a = log[g]
    log[g] = (t, replace(a, version=0))
    bad = rejects(plan, log, events, f"I4: fragment {named(a.fragment)} generated with version 0 (staleness > 1)")
    assert any(m.startswith(f"I4: cell (") and m.endswith(f"of step 3 group {a.fragment.group} from version 0") for m in bad), bad


def test_fragment_from_a_future_version():
    plan, log, events = good("full", steps=3)
    g = gen_at(log, 0, 0, (0, 1))
    t, a = log[g]
    log[g] = (t, replace(a, version=1))
    rejects(plan, log, events, f"I4: fragment {named(a.fragment)} generated with version 1 (staleness > 1)")


def test_stale_cap_exceeded():
    # full, B = 8, cap floor(0.5 x 8) = 4: step 1's group 0 (4 trajectories) is stale; one more stale fragment
    plan, log, events = good("full", steps=3)
    assert plan.stale_cap == 4
    g = index(log, lambda ta: isinstance(ta[1], Generate) and ta[1].fragment.step == 1 and ta[1].version == 1)
    t, a = log[g]
    log[g] = (t, replace(a, version=0))
    bad = rejects(plan, log, events, "I4: step 2 has 6 stale trajectories > cap 4")
    assert f"fragment {named(a.fragment)} uses version 0, generators hold 1" in bad


# ---- fragments -----------------------------------------------------------------------------------------------


def test_fragment_generated_twice():
    plan, log, events = good("gap_tsp")
    g = gen_at(log, 0, 0, (0, 1))
    log.append(log[g])
    rejects(plan, log, events, f"fragment {named(log[g][1].fragment)} generated twice")


def test_fragment_never_reported_generated():
    plan, log, events = good("gap_tsp")
    f = Fragment(1, 0, (2, 3))
    events.pop(frag_event(events, f))
    rejects(plan, log, events, f"fragment {named(f)} never reported generated")


def test_generation_never_generated():
    plan, log, events = good("gap_tsp")
    f = Fragment(1, 1, (2, 3))
    log.pop(gen_at(log, 1, 1, (2, 3)))
    events.pop(frag_event(events, f))
    bad = rejects(plan, log, events, "step 2 group 1: generations [0, 1] not generated once each")
    assert any(m.startswith("I3: chunk (step 2, group 1,") for m in bad), bad


def test_fragment_that_is_not_a_union_of_plan_fragments():
    plan, log, events = good("gap_tsp")
    g = gen_at(log, 0, 0, (0, 1))
    t, a = log[g]
    f = Fragment(0, 0, (0,))
    log[g] = (t, replace(a, fragment=f))
    j = frag_event(events, a.fragment)
    events[j] = replace(events[j], fragment=f)
    rejects(plan, log, events, f"fragment {named(f)} is not a union of whole consecutive fragments of its group")


def _merge(log, events, keep, drop, **changes):
    """Merge the Generate at log[drop] into the one at log[keep] (a gang), with the later end of the two."""
    tk, ak = log[keep]
    _, ad = log[drop]
    f = Fragment(ak.fragment.step, ak.fragment.group, ak.fragment.generations + ad.fragment.generations)
    ek, ed = frag_event(events, ak.fragment), frag_event(events, ad.fragment)
    end = max(events[ek].time, events[ed].time)
    events[ek] = replace(events[ek], fragment=f, time=end)
    events.pop(ed)
    log[keep] = (tk, replace(ak, fragment=f, **changes))
    log.pop(drop)
    return f


def test_gang_from_a_replicated_trainer():
    plan, log, events = good("gap_tsp_tag")  # shard_ranks 1: t0 and t1 TAG step 0 group 1 one fragment each
    assert plan.shard_ranks == 1
    f = _merge(log, events, gen_at(log, 0, 1, (0, 1), "t0"), gen_at(log, 0, 1, (2, 3), "t1"))
    bad = rejects(plan, log, events, f"gang {named(f)} of 2 fragments: only a TAG action of a shard group merges fragments, "
                                     f"at most one per rank (1)")
    assert len(bad) == 1, bad


def _shard_plan():
    # greedy TAG: the shard group t0 (2 ranks) takes a gang of step 0's fragments (4, 5) of group 0 and (0, 1) of
    # group 1 at t = 0 (``Generate.more``); the generators g0 / g1 take the rest
    plan = make_plan("gap_tsp_tag", steps=1, shard_ranks=2, n_train=1, generations=6)
    res = simulate(plan, HAND, bts=BTSConfig(policy="greedy"))
    log, events = list(res.actions), list(res.events)
    assert audit(plan, log, events) == []
    t, a = log[gen_at(log, 0, 0, (4, 5), "t0")]
    assert a.tag and a.more == (Fragment(0, 1, (0, 1)),)
    return plan, log, events


def test_gang_from_a_generator():
    plan, log, events = _shard_plan()
    f = _merge(log, events, gen_at(log, 0, 0, (0, 1), "g0"), gen_at(log, 0, 0, (2, 3), "g1"))
    bad = rejects(plan, log, events, f"gang {named(f)} of 2 fragments: only a TAG action of a shard group merges fragments, "
                                     f"at most one per rank (2)")
    assert len(bad) == 1, bad


def test_gang_larger_than_the_shard_group():
    # g1's fragment (2, 3) of group 0 merged into t0's gang over groups 0 and 1: 3 plan fragments on 2 ranks
    plan, log, events = _shard_plan()
    f = _merge(log, events, gen_at(log, 0, 0, (4, 5), "t0"), gen_at(log, 0, 0, (2, 3), "g1"))
    k = gen_at(log, 0, 0, f.generations, "t0")
    t, a = log[k]
    f = Fragment(0, 0, (2, 3, 4, 5))
    log[k] = (t, replace(a, fragment=f))
    j = frag_event(events, a.fragment)
    events[j] = replace(events[j], fragment=f)
    rejects(plan, log, events, f"gang {named((f,) + a.more)} of 3 fragments: only a TAG action of a shard group merges "
                               f"fragments, at most one per rank (2)")


def test_gang_of_a_shard_groups_tag_is_accepted():
    # a gang of two fragments of one group on the shard group's TAG action is a legal schedule too (the audit is
    # not stricter than the plan): t0 takes (2, 3, 4, 5) of group 0, g1 takes (0, 1) of group 1 in place of (2, 3)
    plan, log, events = _shard_plan()
    k, m = gen_at(log, 0, 0, (4, 5), "t0"), gen_at(log, 0, 0, (2, 3), "g1")
    t, a = log[k]
    tm, am = log[m]
    f = Fragment(0, 0, (2, 3, 4, 5))
    log[k] = (t, replace(a, fragment=f, more=()))
    log[m] = (tm, replace(am, fragment=Fragment(0, 1, (0, 1))))
    j, jm = frag_event(events, a.fragment), frag_event(events, am.fragment)
    events[j] = replace(events[j], fragment=f)
    events[jm] = replace(events[jm], fragment=Fragment(0, 1, (0, 1)))
    assert audit(plan, log, events) == []


def test_gang_whose_parts_are_not_consecutive():
    # t0's gang takes (4, 5) of group 0 and (2, 3) of group 1, skipping (0, 1) of group 1, which a generator takes
    plan, log, events = _shard_plan()
    k, m = gen_at(log, 0, 0, (4, 5), "t0"), gen_at(log, 0, 1, (2, 3))
    t, a = log[k]
    tm, am = log[m]
    log[k] = (t, replace(a, more=(Fragment(0, 1, (2, 3)),)))
    log[m] = (tm, replace(am, fragment=Fragment(0, 1, (0, 1))))
    j = frag_event(events, am.fragment)
    events[j] = replace(events[j], fragment=Fragment(0, 1, (0, 1)))
    bad = rejects(plan, log, events, f"gang {named((a.fragment, Fragment(0, 1, (2, 3))))}: its parts are not consecutive "
                                     f"in dispatch order")
    assert len(bad) == 1, bad


# ---- workers, commits, publishes -----------------------------------------------------------------------------


def test_two_actions_at_once_on_a_worker():
    plan, log, events = good("gap_tsp")
    i = train_at(log, lambda a: a.rank == "t0", nth=1)
    j = train_at(log, lambda a: a.rank == "t0", nth=0)

    def end(a):
        return next(e.time for e in events if isinstance(e, ChunkTrained) and e.chunk == a.chunk and e.rank == a.rank)

    (t, a), (t_prev, prev) = log[i], log[j]
    assert t >= end(prev)
    log[i] = (t - 0.05, a)  # starts before the rank's previous chunk ended
    bad = rejects(plan, log, events,
                  f"worker t0 runs two actions at once ({t_prev}-{end(prev)} and {t - 0.05}-{end(a)})")
    assert len(bad) == 1, bad


def test_round_committed_twice():
    plan, log, events = good("gap_tsp")
    c = index(log, lambda ta: isinstance(ta[1], Commit) and ta[1].step == 1)
    log.append(log[c])
    rejects(plan, log, events, "round 0 of step 2 committed twice")


def test_commit_with_the_wrong_final_flag():
    plan, log, events = good("gap", prompts=2, minibatches=2)
    c = index(log, lambda ta: isinstance(ta[1], Commit) and ta[1].step == 0 and ta[1].round == 0)
    t, a = log[c]
    log[c] = (t, replace(a, final=True))
    rejects(plan, log, events, "commit of round 0 of step 1 has final=True")


def test_round_never_committed():
    plan, log, events = good("gap_tsp")
    c = index(log, lambda ta: isinstance(ta[1], Commit) and ta[1].step == 1)
    log.pop(c)
    events.pop(index(events, lambda e: isinstance(e, Committed) and e.step == 1))
    rejects(plan, log, events, "round 0 of step 2 never committed")


def test_commit_out_of_order():
    # round 1 of step 0 starts its commit before round 0's commit has ended
    plan, log, events = good("gap", prompts=2, minibatches=2)
    c1 = index(log, lambda ta: isinstance(ta[1], Commit) and ta[1].step == 0 and ta[1].round == 1)
    e0 = index(events, lambda e: isinstance(e, Committed) and e.step == 0 and e.round == 0)
    events[e0] = replace(events[e0], time=log[c1][0] + 0.01)
    rejects(plan, log, events, "round 1 of step 1 committed before round 0 of step 1")


def test_commit_of_a_later_step_first():
    plan, log, events = good("gap_tsp", steps=3)
    c1 = index(log, lambda ta: isinstance(ta[1], Commit) and ta[1].step == 1)
    c2 = index(log, lambda ta: isinstance(ta[1], Commit) and ta[1].step == 2)
    e1 = index(events, lambda e: isinstance(e, Committed) and e.step == 1)
    events[e1] = replace(events[e1], time=log[c2][0] + 0.01)
    assert c1 < c2
    rejects(plan, log, events, "round 0 of step 3 committed before round 0 of step 2")


def test_missing_publish():
    plan, log, events = good("gap_tsp", steps=3)
    p = index(log, lambda ta: isinstance(ta[1], Publish) and ta[1].version == 3)
    log.pop(p)
    events.pop(index(events, lambda e: isinstance(e, Published) and e.version == 3))
    bad = rejects(plan, log, events, "version 3 never published")
    assert len(bad) == 1, bad
