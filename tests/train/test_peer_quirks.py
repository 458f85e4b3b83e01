"""Flow-GRPO's quirks as named options (issue 21, item 3), each against the Flow-GRPO rule written out here:

* ``train.ema_update=per_micro_batch``: ``ema.step(params, global_step)`` once per micro-batch, global_step
  bumped once per optimizer step (yifan123/flow_grpo@ac4c86e8 ``scripts/train_sd3.py``);
* ``train.zero_adv_refill``: random zero-advantage samples re-added until the kept count divides the number of
  micro-batches (same script, after the advantages);
* ``train.minibatch_split=samples``: the kept samples permuted and cut into the optimizer steps' minibatches.
"""

from __future__ import annotations

import pytest
import torch

from digenrl.algo.timesteps import stable_seed
from digenrl.config import load_config
from digenrl.train.context import build_context
from digenrl.train.sample_masks import minibatch_masks, zero_adv_refill

from product import product_steps, product_worker
from train_helpers import scored_groups

SMALL = ["train.prompts_per_step=4", "train.generations=4", "sampler.num_steps=4", "train.timestep_fraction=0.5",
         "log.progress=false"]


# ---- EMA ----------------------------------------------------------------------------------------------------

def _flow_grpo_ema(snapshots: list[torch.Tensor], k: int, decay: float, every: int) -> torch.Tensor:
    """Flow-GRPO's training loop over micro-batches: ``snapshots[c]`` = the weights after optimizer step c
    (c = 0: the initial ones); micro-batch i ends optimizer step (i + 1) / k when k divides i + 1; after every
    micro-batch ``ema.step(params, global_step)`` (EMAModuleWrapper.step). Returns the EMA right after the last
    optimizer step's micro-batch plus the k - 1 micro-batch steps that Flow-GRPO runs before the weights change
    again (the state this DigenRL option holds at the commit)."""
    ema = snapshots[0].clone()
    global_step = 0
    commits = len(snapshots) - 1
    for i in range(commits * k + (k - 1)):
        if (i + 1) % k == 0 and global_step < commits:  # accelerator.sync_gradients: the optimizer stepped
            global_step += 1
        params = snapshots[global_step]
        one_minus_decay = 1 - min((1 + global_step) / (10 + global_step), decay)
        if (global_step + 1) % every == 0:
            ema = ema + one_minus_decay * (params - ema)
    return ema


@pytest.mark.parametrize("k,every", [(1, 1), (3, 1), (3, 2), (2, 8)])
def test_per_micro_batch_ema_is_flow_grpos(k, every):
    from digenrl.train.ema import ParamEMA

    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2, bias=False)
    ema = ParamEMA(lin, decay=0.9, every=every, updates=k)
    snaps = [lin.weight.detach().clone()]
    for _ in range(17):
        with torch.no_grad():
            lin.weight.add_(torch.randn_like(lin.weight))
        snaps.append(lin.weight.detach().clone())
        ema.update()
        torch.testing.assert_close(ema.shadow["weight"], _flow_grpo_ema(snaps, k, 0.9, every), rtol=1e-6, atol=1e-6)
    if k > 1:  # one update per commit is a different EMA
        assert not torch.allclose(ema.shadow["weight"], _flow_grpo_ema(snaps, 1, 0.9, every))


def test_ema_update_key_sets_the_count(tiny_policy):
    from digenrl.train.ema import ema_updates_per_commit

    cfg = load_config(None, [*SMALL, "train.ema_update=per_micro_batch", "train.micro_batch=4",
                             "train.minibatches_per_step=2"])
    assert ema_updates_per_commit(cfg.train) == 2  # P G / (M micro_batch) = 16 / (2 x 4)
    assert build_context(cfg, policy=tiny_policy).ema.updates == 2
    assert ema_updates_per_commit(load_config(None, SMALL).train) == 1  # per_commit is the default


def test_a_run_ema_per_micro_batch_matches_flow_grpo(tiny_policy):
    """A run's EMA after 2 steps x 2 minibatches = Flow-GRPO's over the same weights."""
    cfg = load_config(None, [*SMALL, "train.ema_update=per_micro_batch", "train.micro_batch=2",
                             "train.minibatches_per_step=2", "train.ema_decay=0.9", "train.ema_every=2"])
    worker = product_worker(cfg, policy=tiny_policy)
    ctx = worker.ctx
    names = list(ctx.ema.shadow)
    snaps = [torch.cat([ctx.ema.params[n].detach().flatten() for n in names])]
    commit = ctx.transaction.commit

    def recording(**kw):
        out = commit(**kw)
        snaps.append(torch.cat([ctx.ema.params[n].detach().flatten() for n in names]))
        return out

    ctx.transaction.commit = recording
    product_steps(cfg, worker=worker, steps=2)
    assert len(snaps) == 5 and ctx.ema.updates == 4  # k = 16 / (2 x 2)
    got = torch.cat([ctx.ema.shadow[n].flatten() for n in names])
    torch.testing.assert_close(got, _flow_grpo_ema(snaps, 4, 0.9, 2), rtol=1e-6, atol=1e-7)


# ---- zero-advantage re-add ---------------------------------------------------------------------------------

def _flow_grpo_refill(advantages: list[torch.Tensor], num_batches: int, seed: int, step: int) -> torch.Tensor:
    """Flow-GRPO's code on the step's samples (groups concatenated in order), its RNG replaced by the seeded one."""
    mask = torch.cat(advantages) != 0
    true_count = mask.sum()
    if true_count % num_batches != 0:
        false_indices = torch.where(~mask)[0]
        num_to_change = num_batches - (true_count % num_batches)
        if len(false_indices) >= num_to_change:
            g = torch.Generator().manual_seed(stable_seed(seed, step, "zero_adv_refill"))
            random_indices = torch.randperm(len(false_indices), generator=g)[:num_to_change]
            mask[false_indices[random_indices]] = True
    return mask


@pytest.mark.parametrize("zero_groups,nonzero_extra,R", [((0, 2), (), 4), ((1,), (5,), 3), ((0, 1, 2), (), 8),
                                                         ((3,), (), 1)])
def test_zero_adv_refill_is_flow_grpos(zero_groups, nonzero_extra, R):
    gen = torch.Generator().manual_seed(3)
    adv = [torch.randn(4, generator=gen) for _ in range(4)]
    for g in zero_groups:
        adv[g] = torch.zeros(4)
    adv[3][1] = 0.0  # a tie inside a group
    for i in nonzero_extra:
        adv[i // 4][i % 4] = 0.0
    for step in range(3):
        keep = zero_adv_refill(adv, micro_batches=R, run_seed=7, step=step)
        want = _flow_grpo_refill(adv, R, 7, step)
        assert torch.equal(torch.cat(keep), want)
        nonzero = torch.cat(adv) != 0
        assert bool(torch.cat(keep)[nonzero].all())  # only zero-advantage samples are added
        if int((~nonzero).sum()) >= -int(nonzero.sum()) % R:
            assert int(torch.cat(keep).sum()) % R == 0


def test_zero_adv_refill_draws_per_step_and_seed():
    adv = [torch.zeros(4), torch.zeros(4), torch.tensor([1.0, -1.0, 0.5, 0.0])]
    draws = {tuple(torch.cat(zero_adv_refill(adv, micro_batches=8, run_seed=s, step=k)).tolist())
             for s in range(3) for k in range(3)}
    assert len(draws) > 1  # seeded by (run seed, step), not a fixed pick


class _Tied:
    """Mean brightness, except the first prompt of each step: 0.5 for every generation (a zero-advantage group)."""

    name = "tied"

    def __call__(self, images, prompts):
        r = images.double().flatten(1).mean(1).float()
        first = prompts[0].uid
        return torch.where(torch.tensor([p.uid == first for p in prompts]), torch.full_like(r, 0.5), r)


def _tied_worker(policy, *overrides):
    from digenrl.rewards.base import WeightedSum

    cfg = load_config(None, [*SMALL, "train.beta_kl=0.1", *overrides])
    return cfg, product_worker(cfg, policy=policy, reward=WeightedSum({"tied": (1.0, _Tied())}))


def _recording(worker, monkeypatch):
    """Record the worker's commits' 1 / grad_scale and its trained cells ((uid, generation) per round; rounds
    end at the commits): lists filled while it runs."""
    import digenrl.train.chunk_loss as chunk_loss

    kept, rounds = [], [[]]
    commit, train_cells = worker.ctx.transaction.commit, chunk_loss.train_cells

    def recording(**kw):
        kept.append(1 / kw["grad_scale"])
        rounds.append([])
        return commit(**kw)

    def counting(policy, group, cells, **kw):
        st = train_cells(policy, group, cells, **kw)
        uid = group.prompts[0].uid
        rounds[-1].append((st.trained, {(uid, g) for g, _ in cells}, group))
        return st

    worker.ctx.transaction.commit = recording
    monkeypatch.setattr(chunk_loss, "train_cells", counting)
    return kept, rounds


def _run_recorded(policy, monkeypatch, *overrides):
    """One step of a run with the tied reward -> (its row, the commits' 1 / grad_scale, the trained cells)."""
    cfg, worker = _tied_worker(policy, *overrides)
    kept, rounds = _recording(worker, monkeypatch)
    _, (row,) = product_steps(cfg, worker=worker, steps=1)
    monkeypatch.undo()
    return row, kept, sum(n for r in rounds for n, _, _ in r)


def test_a_run_refill_trains_and_counts_the_readded(tiny_policy, monkeypatch):
    """Group 0 is tied (4 zero advantages), the other 12 samples are not. R = P G / micro_batch = 8: Flow-GRPO's
    rule re-adds 4 zero-advantage samples (12 -> 16); they train (S = 2 cells each, their KL counts) and the
    commit divides by 16. R = 2: 12 is a multiple already, nothing is added. Off: 12, the tied group untrained."""
    import copy

    row, kept, trained = _run_recorded(copy.deepcopy(tiny_policy), monkeypatch, "train.zero_adv_refill=true",
                                       "train.micro_batch=2")
    assert row["kept_fraction"] == 1.0 and kept == [pytest.approx(16)] and trained == 32
    row, kept, trained = _run_recorded(copy.deepcopy(tiny_policy), monkeypatch, "train.zero_adv_refill=true",
                                       "train.micro_batch=8")
    assert row["kept_fraction"] == 0.75 and kept == [pytest.approx(12)] and trained == 24
    row, kept, trained = _run_recorded(copy.deepcopy(tiny_policy), monkeypatch)
    assert row["kept_fraction"] == 0.75 and kept == [pytest.approx(12)] and trained == 24


# ---- random-sample minibatches -----------------------------------------------------------------------------

def _groups(policy, *overrides, ties=()):
    return scored_groups(policy, [*SMALL, *overrides], ties)


def _flow_grpo_minibatches(groups, M, seed, step, epoch):
    """Flow-GRPO: filter, permute the kept samples (seeded here), cut into M consecutive parts -> (uid, gen) sets."""
    samples = [(g.prompts[0].uid, int(gen)) for g in groups for gen, a in zip(g.gen_index, g.advantages) if a != 0]
    perm = torch.randperm(len(samples), generator=torch.Generator().manual_seed(
        stable_seed(seed, step, epoch, "minibatch_split")))
    shuffled = [samples[i] for i in perm.tolist()]
    size = [len(shuffled) // M + (m < len(shuffled) % M) for m in range(M)]
    starts = [sum(size[:m]) for m in range(M + 1)]
    return [set(shuffled[starts[m]:starts[m + 1]]) for m in range(M)]


def test_sample_minibatches_are_flow_grpos(tiny_policy):
    _, groups = _groups(tiny_policy, ties=(1,))
    kept = {k: g.advantages != 0 for k, g in enumerate(groups)}
    for epoch in range(2):
        got = minibatch_masks(kept, 3, run_seed=5, step=2, epoch=epoch)
        got = [{(groups[k].prompts[0].uid, int(j)) for k, m in mb.items() for j in torch.nonzero(m).flatten()}
               for mb in got]
        assert got == _flow_grpo_minibatches(groups, 3, 5, 2, epoch)
    assert len(set().union(*got)) == 12  # the tied group is in no minibatch


def test_a_run_trains_sample_minibatches(tiny_policy, monkeypatch):
    """minibatch_split=samples: each commit trains exactly the cells of the oracle's part and divides by its
    size; each inner epoch draws its own permutation; groups split differently."""
    cfg, worker = _tied_worker(tiny_policy, "train.minibatches_per_step=2", "train.inner_epochs=2",
                               "train.minibatch_split=samples", "train.beta_kl=0")
    kept, rounds = _recording(worker, monkeypatch)
    product_steps(cfg, worker=worker, steps=1)
    begun = [set().union(*(cells for _, cells, _ in r)) for r in rounds[:-1]]
    groups = {g.prompts[0].uid: g for r in rounds for _, _, g in r}
    order = [p.uid for p in worker.ctx.task.train_prompts(0, 4, cfg.seed)]
    groups = [groups[u] for u in order if u in groups]
    want = [mb for e in range(2) for mb in _flow_grpo_minibatches(groups, 2, cfg.seed, 0, e)]
    assert begun == want and kept == [pytest.approx(6)] * 4
    assert begun[0] != begun[2]  # a new permutation per inner epoch
    assert len({u for u, _ in begun[0]}) > 2  # the minibatch mixes samples of more prompt groups than half the groups


@pytest.mark.parametrize("overrides,match", [
    (["train.minibatch_split=samples", "runtime.mode=gap_tsp"], "train.minibatch_split"),
    (["train.minibatch_split=samples", "runtime.mode=full"], "train.minibatch_split"),
    (["train.zero_adv_refill=true", "train.micro_batch=4", "runtime.mode=gap"], "train.zero_adv_refill"),
    (["train.zero_adv_refill=true"], "train.micro_batch"),
    (["train.zero_adv_refill=true", "train.micro_batch=4", "train.filter_zero_advantage=false"],
     "train.zero_adv_refill"),
    (["train.ema_update=per_micro_batch"], "train.micro_batch"),
    (["train.micro_batch=5", "train.zero_adv_refill=true"], "train.micro_batch"),
    (["train.ema_update=per_micro_batch", "train.micro_batch=8", "train.minibatches_per_step=4"],
     "train.ema_update"),
])
def test_quirk_options_are_validated(overrides, match):
    from digenrl.config import ConfigError

    with pytest.raises(ConfigError, match=match):
        load_config(None, [*SMALL, *overrides])


def test_unused_micro_batch_is_not_checked():
    """A preset's micro_batch stays a note when its options are off (a shrunk preset still loads)."""
    assert load_config(None, [*SMALL, "train.micro_batch=5"]).train.micro_batch == 5


def test_ray_plans_sample_minibatches_in_barrier_modes():
    """minibatch_split=samples on Ray: every round plans every group (the trainers train the round's samples)."""
    from digenrl.control.run_plan import plan_run

    for mode in ("colocated", "naive"):
        plan = plan_run(load_config(None, [*SMALL, f"runtime.mode={mode}", "train.minibatch_split=samples",
                                           "train.minibatches_per_step=2"])).plan
        assert plan.sample_split and [plan.round_groups(r) for r in range(plan.rounds)] == [(0, 1, 2, 3)] * 2
