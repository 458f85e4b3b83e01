"""Worker-side timing of the operations of ``schedule.cost`` with the code the workers run (mean of
``repeats`` after one warm-up: a step's time is a sum of op times, so its expectation is the sum of the
means; op times on a shared machine are right-skewed, and medians made the CPU benchmark's predictions 7-15%
optimistic per op; the sizes of an op are timed round-robin, ``_mean_times``), called inside the actors by
``calibrate``:

* generation (per fragment size n): sampling, VAE decode, reward, and serialising the trajectories;
* training (per chunk size in cells): forward + backward of ``train_cells`` (gradients are zeroed after);
  ``allreduce`` of gradient-sized buffers over the trainer group, ``optimizer`` (the rest of a commit, on
  copies of the trainable tensors with zero gradients: gradient clipping, a step of the run's own optimizer
  class and settings, the EMA update where this rank keeps one), ``publish`` (copy + serialise + load of the
  trainable state).

On a sharded or sequence-parallel pool every rank measures at once (each forward is a collective) with its
lane's share of the fragment or chunk (``rank_cells``), so a size means the group's action of that size; ``allreduce`` is 0 there (the
gradients are reduce-scattered inside each chunk's backward, which ``train`` already times).
"""

from __future__ import annotations

import pickle
import statistics
import time


def _mean_time(fn, repeats: int) -> float:
    """Mean seconds of ``repeats`` timed calls of ``fn`` after one warm-up (device synchronised around each)."""
    return _mean_times({0: fn}, repeats)[0]


def _mean_times(fns: dict, repeats: int) -> dict:
    """``_mean_time`` of several callables (keyed alike in the result), timed round-robin (one warm-up each, then ``repeats`` rounds over all
    of them in a fixed order): a change of the machine's speed during the measurement then shifts every size
    alike instead of bending the curve over sizes. Every rank of a sharded pool calls them in the same order."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for fn in fns.values():
        fn()
    ts: dict = {k: [] for k in fns}
    for _ in range(max(1, repeats)):
        for k, fn in fns.items():
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            ts[k].append(time.perf_counter() - t0)
    return {k: statistics.fmean(v) for k, v in ts.items()}


def _probe_prompt(worker):
    return worker.task.train_prompts(0, 1, worker.cfg.seed)[0]


def time_generation(worker, policy, sizes: list[int], repeats: int) -> dict[int, dict[str, float]]:
    """size -> {sample, decode, reward, transfer} seconds for one fragment of that many generations."""
    import torch

    from digenrl.control.run_plan import timestep_plan
    from digenrl.rollout.sampler import sample_trajectories

    prompt, plan = _probe_prompt(worker), timestep_plan(worker.cfg, 0)
    fns = {}
    for size in sizes:
        gens = list(range(size))
        if getattr(worker, "sharded", False):  # this rank's lane's share of the group's fragment
            gens = gens[worker._lane.lane::worker._lane.lanes] or gens[:1]

        def sample(gens=gens):
            return sample_trajectories(policy, [prompt] * len(gens), gens, step=0, run_seed=worker.cfg.seed,
                                       version=0, settings=worker.sampler, plan=plan, decode=False)

        tb = sample()
        with torch.no_grad():
            images = policy.decode(tb.final.to(next(policy.parameters()).device)).float().cpu()
        fns.update({
            (size, "sample"): sample,
            (size, "decode"): lambda tb=tb, images=images: policy.decode(tb.final.to(images.device)),
            (size, "reward"): lambda tb=tb, images=images: worker.reward.score(images, tb.prompts),
            (size, "transfer"): lambda tb=tb: pickle.loads(pickle.dumps(tb, protocol=5)),
        })
    means = _mean_times(fns, repeats)
    return {size: {phase: means[(size, phase)] for phase in ("sample", "decode", "reward", "transfer")}
            for size in sizes}


def time_training(worker, cell_sizes: list[int], repeats: int) -> dict:
    """{"train": {cells: s}, "allreduce": s, "optimizer": s, "publish": s} on a trainer rank (no state change)."""
    import torch
    import torch.distributed as dist

    from digenrl.control.run_plan import timestep_plan
    from digenrl.train.chunk_loss import train_cells
    from digenrl.train.step_math import assign_advantages, generate

    if worker.tx.open:
        raise RuntimeError(f"{worker.name}: cannot measure while a transaction is open")
    cfg, policy = worker.cfg, worker.policy
    G = cfg.train.generations
    group = generate(policy, [_probe_prompt(worker)] * G, list(range(G)), step=0, run_seed=cfg.seed, version=0,
                     settings=worker.sampler, plan=timestep_plan(cfg, 0), reward=worker.reward)
    group.rewards = torch.linspace(0.0, 1.0, G)  # any spread: only the time matters
    assign_advantages(group, std_mode="group", adv_clip_max=cfg.train.adv_clip_max)
    S = len(group.trained_steps)  # (nft: its training slots; no latents recorded)
    grid = [(g, j) for j in range(S) for g in range(G)]  # timestep-major, like the TSP tiling
    fns = {}
    for c in cell_sizes:
        cells = grid[: min(c, len(grid))]
        if worker._gsize > 1:  # its lane's share (a sequence-parallel lane trains them all, split by tokens)
            from digenrl.train.sharding import rank_cells

            cells = rank_cells(cells, worker._lane.lane, worker._lane.lanes)[0]
        fns[c] = lambda cells=cells: train_cells(policy, group, cells, settings=worker.ctx.loss, loss_scale=1e-9,
                                                 ref_policy=worker.ctx.ref_policy, collective=worker.sharded)
    train = _mean_times(fns, repeats)
    worker.ctx.optimizer.zero_grad(set_to_none=True)
    params = [p for p in policy.parameters() if p.requires_grad]
    allreduce = 0.0
    if dist.is_initialized() and worker._world > 1 and not worker.sharded:
        group_pg = worker.tx.process_group
        bufs = [torch.zeros_like(p) for p in params]  # gradient-sized: what the commit all-reduces
        allreduce = _mean_time(lambda: [dist.all_reduce(b, group=group_pg) for b in bufs], repeats)
    elif dist.is_initialized() and worker.sharded and worker.tx.replica_group is not None:  # hybrid sharding
        replicas = worker.tx.replica_group  # the commit sums the gradient shards across the replicas
        bufs = [torch.zeros_like(p.to_local() if hasattr(p, "to_local") else p) for p in params]
        allreduce = _mean_time(lambda: [dist.all_reduce(b, group=replicas) for b in bufs], repeats)

    optimizer = _mean_time(_commit_work(worker, params), repeats)

    def publish():
        from .publish import state_copy

        state = pickle.loads(pickle.dumps(state_copy(policy), protocol=5))
        if not worker.sharded:  # the load stands for the generator's (a sharded rank holds DTensor shards)
            policy.load_trainable_state_dict(state)

    return {"train": train, "allreduce": allreduce, "optimizer": optimizer,
            "publish": _mean_time(publish, repeats)}


def _commit_work(worker, params):
    """A callable doing a commit's local work on copies of ``params`` (the live weights, gradients and optimizer
    state are untouched): clip the gradient norm, step a fresh optimizer of the run's class and settings, and
    update an EMA shadow if the rank keeps one. It needs twice the trainable bytes while it is timed."""
    import torch

    tx, live = worker.tx, worker.ctx.optimizer
    copies = [p.detach().clone().requires_grad_(True) for p in params]
    for c in copies:
        c.grad = torch.zeros_like(c)
    hyper = {k: v for k, v in live.param_groups[0].items() if k != "params"}
    opt = type(live)(copies, lr=hyper["lr"])
    opt.param_groups[0].update(hyper)  # every setting of the run's group (some are not constructor arguments)
    shadow = [c.detach().clone() for c in copies] if worker.ctx.ema is not None else []

    def work():
        if tx.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(copies, tx.max_grad_norm)
        opt.step()
        with torch.no_grad():
            for s, c in zip(shadow, copies):
                s.add_(0.1 * (c.detach() - s))

    return work
