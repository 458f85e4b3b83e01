"""Measured cost profiles of the real workers: for BTS at the start of a run, and ``digenrl profile``.

Every op of ``schedule.cost`` is timed with the code the workers run (median of ``repeats`` after one
warm-up), inside the actors of the configured pools, so threads, placement and the Ray call overhead are
those of a run; one generator and the trainer ranks measure at the same time, as they work in a pipelined
step (``calibrate(concurrent=False)`` measures them one after the other):

* generation (per fragment size n, on a generator; in TAG / colocated modes also on a trainer rank):
  ``denoise(n)`` = sampling time / T, ``vae_decode(n)``, ``reward(n)``, ``transfer(n)`` = serialising the
  trajectories (object store) + one actor-call round trip;
* ``train_chunk(c)`` = forward + backward of c cells + one call round trip (gradients are zeroed after);
* ``allreduce`` of gradient-sized buffers over the trainer group, ``optimizer`` (~6 passes over the
  trainable tensors, AdamW's work), ``publish`` (copy + serialise + load of the trainable state);
  ``tag_switch`` = 0 (no inference copy to build without FSDP).

The JSON written is the ``digenrl-profile`` schema of ``digenrl.sim.profile`` (``simulate --profile``).
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import sys
import time
from pathlib import Path

from digenrl.schedule.cost import GENERATOR, TRAINER


def _median_time(fn, repeats: int) -> float:
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    fn()  # warm-up
    ts = []
    for _ in range(max(1, repeats)):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _probe_prompt(worker):
    return worker.task.train_prompts(0, 1, worker.cfg.seed)[0]


def time_generation(worker, policy, sizes: list[int], repeats: int) -> dict[int, dict[str, float]]:
    """size -> {sample, decode, reward, transfer} seconds for one fragment of that many generations."""
    import torch

    from digenrl.rollout.sampler import sample_trajectories
    from digenrl.train.context import timestep_plan

    prompt, plan = _probe_prompt(worker), timestep_plan(worker.cfg, 0)
    out = {}
    for n in sizes:
        gens = list(range(n))

        def sample():
            return sample_trajectories(policy, [prompt] * n, gens, step=0, run_seed=worker.cfg.seed, version=0,
                                       settings=worker.sampler, plan=plan, decode=False)

        tb = sample()
        with torch.no_grad():
            images = policy.decode(tb.final.to(next(policy.parameters()).device)).float().cpu()
        out[n] = {
            "sample": _median_time(sample, repeats),
            "decode": _median_time(lambda: policy.decode(tb.final.to(images.device)), repeats),
            "reward": _median_time(lambda: worker.reward.score(images, tb.prompts), repeats),
            "transfer": _median_time(lambda: pickle.loads(pickle.dumps(tb, protocol=5)), repeats),
        }
    return out


def time_training(worker, cell_sizes: list[int], repeats: int) -> dict:
    """{"train": {cells: s}, "allreduce": s, "optimizer": s, "publish": s} on a trainer rank (no state change)."""
    import torch
    import torch.distributed as dist

    from digenrl.train.chunk_loss import train_cells
    from digenrl.train.context import timestep_plan
    from digenrl.train.step_work import assign_advantages, generate

    if worker.tx.open:
        raise RuntimeError(f"{worker.name}: cannot measure while a transaction is open")
    cfg, policy = worker.cfg, worker.policy
    G = cfg.train.generations
    group = generate(policy, [_probe_prompt(worker)] * G, list(range(G)), step=0, run_seed=cfg.seed, version=0,
                     settings=worker.sampler, plan=timestep_plan(cfg, 0), reward=worker.reward)
    group.rewards = torch.linspace(0.0, 1.0, G)  # any spread: only the time matters
    assign_advantages(group, std_mode="group", adv_clip_max=cfg.train.adv_clip_max)
    S = group.latents.shape[1]
    grid = [(g, j) for j in range(S) for g in range(G)]  # timestep-major, like the TSP tiling
    train = {}
    for c in cell_sizes:
        cells = grid[: min(c, len(grid))]
        train[c] = _median_time(lambda: train_cells(policy, group, cells, settings=worker.ctx.loss, loss_scale=1e-9,
                                                    ref_policy=worker.ctx.ref_policy), repeats)
    worker.ctx.optimizer.zero_grad(set_to_none=True)
    params = [p for p in policy.parameters() if p.requires_grad]
    bufs = [torch.zeros_like(p) for p in params]
    allreduce = 0.0
    if dist.is_initialized() and worker._world > 1:
        group_pg = worker.tx.process_group
        allreduce = _median_time(lambda: [dist.all_reduce(b, group=group_pg) for b in bufs], repeats)

    def adam_like():
        for _ in range(6):
            torch._foreach_mul_(bufs, 1.0)

    optimizer = _median_time(adam_like, repeats)

    def publish():
        from .publish import state_copy

        state = pickle.loads(pickle.dumps(state_copy(policy), protocol=5))
        policy.load_trainable_state_dict(state)

    return {"train": train, "allreduce": allreduce, "optimizer": optimizer,
            "publish": _median_time(publish, repeats)}


def build_profile(gen: dict, trn_gen: dict, meas: dict, T: int, overhead_s: float, source: str,
                  pools: tuple[int, int]) -> dict:
    """The ``digenrl-profile`` JSON dict from the measurements (see the module docstring)."""

    def pts(d: dict, key: str, add: float = 0.0, div: float = 1.0) -> list:
        return [[int(n), max(0.0, v[key] / div + add)] for n, v in sorted(d.items())]

    ops = {}
    for pool, g in ((GENERATOR, gen or trn_gen), (TRAINER, trn_gen or gen)):
        ops[f"{pool}/denoise"] = pts(g, "sample", div=T)
        ops[f"{pool}/vae_decode"] = pts(g, "decode")
        ops[f"{pool}/reward"] = pts(g, "reward")
        ops[f"{pool}/transfer"] = pts(g, "transfer", add=overhead_s)
    ops["train_chunk"] = [[int(c), s + overhead_s] for c, s in sorted(meas["train"].items())]
    ops["allreduce"] = [[1, meas["allreduce"]]]
    ops["optimizer"] = [[1, meas["optimizer"] + overhead_s]]
    ops["publish"] = [[1, meas["publish"] + overhead_s]]
    ops["tag_switch"] = [[1, 0.0]]
    return {"format": "digenrl-profile", "version": 1, "source": source, "generators": pools[0],
            "trainers": pools[1], "ops": ops}


def _sizes_upto(n: int) -> list[int]:
    out, k = [], 1
    while k < n:
        out.append(k)
        k *= 2
    return out + [n]


def plan_sizes(plan) -> tuple[list[int], list[int]]:
    """Fragment sizes and chunk sizes (cells) a run of ``plan`` uses."""
    from digenrl.schedule import classic_chunks, group_fragments, tsp_chunks

    frags = {f.size for f in group_fragments(plan, 0, 0)}
    chunks = {c.size for c in tsp_chunks(plan, 0, 0)} if plan.mode.tsp else {
        c.size for g in range(plan.prompts) for cs in classic_chunks(plan, 0, g).values() for c in cs}
    return sorted(frags), sorted(chunks)


def calibrate(setup, pools, repeats: int = 2, gen_sizes: list[int] | None = None,
              cell_sizes: list[int] | None = None, trainer_generation: bool | None = None,
              concurrent: bool = True) -> dict:
    """Measure the ops on the live workers.

    ``concurrent``: one generator and every trainer rank measure at the same time, as the pools work in a
    pipelined step (on a shared CPU node they slow each other down; on separate GPUs it changes nothing);
    else the generator first, then the trainer ranks (together: their all-reduce is a collective).
    """
    import ray

    from .cluster import get_named

    plan = setup.plan
    fs, cs = plan_sizes(plan)
    gen_sizes, cell_sizes = gen_sizes or fs, cell_sizes or cs
    rank0 = next(iter(pools.trainers))
    ray.get(pools.rank0.ping.remote())
    pings = []
    for _ in range(7):
        t0 = time.perf_counter()
        ray.get(pools.rank0.ping.remote())
        pings.append(time.perf_counter() - t0)
    overhead = statistics.median(pings)
    if trainer_generation is None:
        trainer_generation = plan.mode.tag or not plan.mode.disaggregated
    gen_refs = {w: a.measure_generate.remote(gen_sizes, repeats) for w, a in list(pools.generators.items())[:1]}
    if not concurrent:
        get_named(gen_refs, "profiling")
    trn_refs = {w: t.measure.remote(gen_sizes if trainer_generation else [], cell_sizes, repeats)
                for w, t in pools.trainers.items()}
    gen = get_named(gen_refs, "profiling")[0] if gen_refs else {}
    meas = get_named(trn_refs, "profiling")[0]
    source = (f"digenrl runtime profile: {setup.cfg.model.kind}, {rank0} + {len(pools.generators)} generators, "
              f"{setup.cfg.runtime.threads_per_worker} threads/worker, {time.strftime('%Y-%m-%d %H:%M')}")
    return build_profile(gen, meas["generate"], meas, plan.sampling_steps, overhead, source,
                         (len(pools.generators), len(pools.trainers)))


def cost_model(setup, pools, run_dir: Path | None = None):
    """The scheduler's cost model: ``runtime.profile`` if given; measured now in TAG modes; else None."""
    from digenrl.sim.profile import ProfileCost

    if setup.profile is not None:
        return setup.profile
    if not setup.plan.mode.tag:
        return None
    data = calibrate(setup, pools)
    if run_dir is not None:
        (Path(run_dir) / "profile.json").write_text(json.dumps(data, indent=1))
    return ProfileCost.from_dict(data, where="measured profile")


def main(argv: list[str] | None = None) -> int:
    """``digenrl profile [--config X] [key=value ...] --out profile.json``: measure this machine's costs."""
    ap = argparse.ArgumentParser(prog="digenrl profile", description=main.__doc__.split(": ", 1)[1])
    ap.add_argument("--config", "-c", default=None, help="YAML config (default: the built-in CPU demo)")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides (runtime.* sets the pools)")
    ap.add_argument("--out", required=True, help="profile JSON to write (digenrl simulate --profile)")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats per point (median; default 3)")
    args = ap.parse_intermixed_args(argv)
    from digenrl.config import ConfigError, load_config

    from .cluster import ray_session, start_pools
    from .setup import runtime_plan

    out = Path(args.out)
    try:
        if args.repeats < 1:
            raise ConfigError(f"--repeats: must be >= 1 (got {args.repeats})")
        if not out.parent.is_dir():
            raise ConfigError(f"--out: directory {str(out.parent)!r} does not exist")
        cfg = load_config(args.config, args.overrides)
        setup = runtime_plan(cfg)
    except ConfigError as e:
        print(f"digenrl profile: error: {e}", file=sys.stderr)
        return 2
    G, S = setup.plan.generations, setup.trained_timesteps
    with ray_session(setup):
        pools = start_pools(setup)
        try:
            data = calibrate(setup, pools, args.repeats, _sizes_upto(G), _sizes_upto(G * S),
                             trainer_generation=True)
        finally:
            pools.kill()
    out.write_text(json.dumps(data, indent=1))
    print(f"wrote {out} ({len(data['ops'])} op curves; use: digenrl simulate --profile {out} ...)")
    return 0
