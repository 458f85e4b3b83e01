"""Compare the training algorithms on the CPU digits demo: eval reward against steps and compute, 3 seeds each.

    python scripts/algorithms_digits.py                    # every algorithm x seeds 0 1 2, then the page
    python scripts/algorithms_digits.py --algorithms nft --seeds 0   # a subset, merged into the results file
    python scripts/algorithms_digits.py --render           # docs/algorithms.md + figure from the results file

Each run is ``digenrl train`` (the built-in demo: colocated, single process) with ``train.algorithm`` and the
overrides below, one after another (``scripts/demo_seeds.run_seed``: wall time, CPU seconds of the run, load
average around it). The compute axis is the run's CPU seconds (user + system), which other load on the
machine changes much less than wall time. Results: ``benchmarks/results/algorithms_digits.json``; page:
``docs/algorithms.md`` with ``docs/figures/algorithms_digits.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_seeds import run_seed  # noqa: E402

sys.path.insert(0, str(ROOT / "src"))
from digenrl.safe_files import atomic_write_bytes  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "algorithms_digits.json"
PAGE = ROOT / "docs" / "algorithms.md"
FIGURE = ROOT / "docs" / "figures" / "algorithms_digits.png"
# the demo's own settings (src/digenrl/config/ defaults) plus what each algorithm needs on it
ALGORITHMS: dict[str, list[str]] = {
    "flow_grpo": [],
    "grpo_guard": ["train.algorithm=grpo_guard"],
    "mixgrpo": ["train.algorithm=mixgrpo", "train.window_size=4"],  # T = 10: window range [0, 8)
    "nft": ["train.algorithm=nft"],
}


def _record(r: dict) -> dict:
    """Add one run to the results file (read, replace the same (algorithm, seed), write atomically) under an OS
    file lock, so two invocations running different algorithms at once both keep their runs."""
    import fcntl

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS.with_name(RESULTS.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"runs": []}
        data["runs"] = [x for x in data["runs"] if (x["algorithm"], x["seed"]) != (r["algorithm"], r["seed"])] + [r]
        atomic_write_bytes(RESULTS, json.dumps(data, indent=1).encode())
    return data


def run(algorithms: list[str], seeds: list[int], runs: Path) -> dict:
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"runs": []}
    for algo in algorithms:
        for seed in seeds:
            r = run_seed(seed, ALGORITHMS[algo] + ["--overwrite"], runs / f"algo_{algo}")
            r.update(algorithm=algo, overrides=ALGORITHMS[algo])
            print(f"{algo} seed {seed}: eval {r['eval_initial']:.3f} -> {r['eval_final']:.3f} "
                  f"(peak {r['eval_peak']:.3f}), {r['cpu_s']:.0f} CPU s, {r['wall_s']:.0f} s", flush=True)
            data = _record(r)
    return data


def summary(data: dict) -> list[dict]:
    rows = []
    for algo in ALGORITHMS:
        rs = sorted((r for r in data["runs"] if r["algorithm"] == algo), key=lambda r: r["seed"])
        if not rs:
            continue
        mean = lambda k: sum(r[k] for r in rs) / len(rs)  # noqa: E731
        hit = [next((s for s, v in r["eval_curve"] if v >= 0.9), None) for r in rs]
        rows.append({"algorithm": algo, "seeds": [r["seed"] for r in rs], "initial": mean("eval_initial"),
                     "final": mean("eval_final"), "final_min": min(r["eval_final"] for r in rs),
                     "peak": mean("eval_peak"), "cpu_s": mean("cpu_s"), "wall_s": mean("wall_s"),
                     "steps_to_0.9": hit, "learns": all(r["eval_initial"] <= 0.7 and r["eval_final"] >= 0.9
                                                        for r in rs)})
    return rows


def figure(data: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for algo in ALGORITHMS:
        rs = [r for r in data["runs"] if r["algorithm"] == algo]
        for i, r in enumerate(rs):
            steps = [s for s, _ in r["eval_curve"]]
            vals = [v for _, v in r["eval_curve"]]
            last = max(steps) or 1
            cpu = [r["cpu_s"] * s / last for s in steps]  # the run's CPU seconds, spread evenly over its steps
            kw = dict(label=algo if i == 0 else None, color=f"C{list(ALGORITHMS).index(algo)}", alpha=0.8, lw=1.2)
            axes[0].plot(steps, vals, **kw)
            axes[1].plot(cpu, vals, **kw)
    for ax, xl in zip(axes, ("training step", "CPU seconds of the run (evenly spread over its steps)")):
        ax.axhline(0.9, color="grey", lw=0.6, ls="--")
        ax.set_xlabel(xl)
        ax.set_ylabel("eval reward (digits classifier)")
        ax.legend(fontsize=8)
    fig.suptitle("Training algorithms on the CPU digits demo, one line per seed")
    FIGURE.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(FIGURE, dpi=110, bbox_inches="tight")
    plt.close(fig)


def render(data: dict) -> str:
    rows = summary(data)
    lines = ["# Training algorithms on the digits demo\n",
             "Generated by `scripts/algorithms_digits.py` from `benchmarks/results/algorithms_digits.json` (do not "
             "edit by hand). Each run is the built-in CPU demo (`digenrl train`, colocated, one process) with "
             "`train.algorithm` and the overrides listed, on a 2-core machine; each invocation of the script runs its "
             "seeds one after another, and two invocations may run at once (one core each). CPU seconds are the "
             "run's own user + system time; wall time depends on the machine's other load (the load average "
             "around each run is in the results file).\n",
             "| algorithm | overrides | seeds | eval before | eval after (mean, min) | peak | steps to 0.9 "
             "| CPU s | wall s | learns (<= 0.7 -> >= 0.9, every seed) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ov = " ".join(f"`{o}`" for o in ALGORITHMS[r["algorithm"]]) or "(the demo's defaults)"
        hit = ", ".join("-" if h is None else str(h) for h in r["steps_to_0.9"])
        lines.append(f"| {r['algorithm']} | {ov} | {', '.join(map(str, r['seeds']))} | {r['initial']:.3f} | "
                     f"{r['final']:.3f}, {r['final_min']:.3f} | {r['peak']:.3f} | {hit} | {r['cpu_s']:.0f} | "
                     f"{r['wall_s']:.0f} | {'yes' if r['learns'] else 'no'} |")
    lines += ["", "nft runs with DiffusionNFT's own defaults: the soft old policy (`train.nft_old_policy=soft`, "
              "`nft_old_decay` (0, 0.001, 0.5): the generators sample with it and v_old is its forward) and the "
              "DPM-Solver++ 2M sampler (`sampler.nft_solver=dpmpp_2m`, the reference's `dpm2`), eval with the Euler "
              "ODE like every algorithm.\n",
              f"![eval reward per step and per CPU second](figures/{FIGURE.name})\n",
              "The simulator's price of each algorithm's step on GPU testbeds is in docs/simulation.md "
              "(\"Per algorithm\").\n", CONVENTIONS]
    return "\n".join(lines)


# Hand-written prose (no figures): where each algorithm follows its authors' code and which keys choose otherwise.
CONVENTIONS = """## As the authors run them

Each algorithm follows its reference code by default; where DigenRL offers another form it is a named key. Each
default is tested against the reference's formula written out in the test, in an off-policy case where the
other form gives another gradient (`tests/train/test_reference_forms.py`).

**MixGRPO with several rewards** (`train.adv_per_reward: true`). MixGRPO's `advantage_aggr`
(`fastvideo/train_grpo_flux.py`) normalises each reward in its group, sums the weighted advantages, clamps the
sum to `+-train.adv_clip_max` and takes one clipped loss: `L(clamp(sum_k w_k A_k))`. That is
`train.reward_aggregation: advantages`, the default for `train.algorithm=mixgrpo`; `losses` takes
`sum_k w_k L(A_k)` with each `A_k` clipped (DanceGRPO's vq / mq), the default of the other algorithms. The two
agree while every ratio lies inside the clip interval (a step's first minibatch) and differ once one leaves it.

**MixGRPO's minibatches** (`train.minibatch_split: generations`). MixGRPO holds one prompt per GPU and steps the
optimizer every 3 of its 12 samples, so each optimizer step takes 3 generations of every prompt. Here minibatch
m takes generations `floor(j M / G) = m` of every group. A group's block needs only that group's rewards, so
the split runs in every mode, but a minibatch's commit needs every group: in the pipelined modes only the first
minibatch overlaps generation, the other M - 1 train after it. The MixGRPO presets use it, and their planned
default is therefore colocated (their plan blocks give the predicted step times).

**GRPO-Guard's RatioNorm bias** (`train.guard_bias`). flow_grpo's `train_sd3_GRPO_Guard.py` averages the bias
`mean((mu_theta - mu_old)^2) / (2 sigma^2)` over the whole per-device batch of a timestep (`.mean(dim=())` on
a 1-D log-prob reduces every dimension). `batch`, the default, averages it over the cells one forward holds at
one trained timestep (they share sigma), which is what one device forwards together:

| where | the cells that share a bias |
|---|---|
| TSP modes (`gap_tsp`, `gap_tsp_tag`, `full`) on replicated ranks, `colocated` (packed: one worker's share of a group, tiled alike), the I1 reference | one chunk of the `chunk_generations x chunk_timesteps` tiling at one timestep: up to `chunk_generations` generations of one group |
| classic layout (`naive`, `gap`) | one trained timestep x the rank's data-parallel share of the group's generations |
| sharded pool (`train.sharding: fsdp`) | the rank's share of a chunk (`train.sharding.rank_cells`) at one timestep |
| flow_grpo | `sample.train_batch_size` samples of the shuffled step (several prompts) at one timestep |

The cells a filter or mask drops are not in it. On policy (a step's first round) the bias and its gradient are
0 whatever the unit, so every mode trains alike; in later rounds the means are over differently composed sets
(the same in expectation), and the I1 reference, one colocated worker and the TSP modes on replicated ranks,
which hold the same chunks, stay equal (I1). `cell` gives each cell its own bias, the paper's per-sample formula,
the same in every layout.

**DiffusionNFT's model time** (`sampler.integer_timesteps: sampling`). DiffusionNFT feeds SD3 `int(sigma *
1000)` while sampling and the float time of the noised sample in training; `sampling` does that (the NFT preset
uses it), `true` gives integer time in both (DanceGRPO, MixGRPO), and a ratio algorithm refuses `sampling`
(its training forward must see the sampler's time to recompute the behaviour log-prob).

**Reproducible sums** (`train.grad_sum`). TSP hands a chunk to whichever trainer is free, so with several
trainers (replicated ranks, or shard groups under hybrid sharding) which trainer sums which chunks, in which
order, depends on timing, and float32 sums differ in their last bits, which training amplifies (two clean runs
of one config ended apart). `auto` (the default) sums in float64 there and casts at the commit (`train.transaction`): two
clean runs end bitwise equal (`tests/runtime/test_grad_sum.py`). It costs 8 bytes per trainable parameter per
rank (per shard), which the memory plan counts; `fp32` keeps the arrival-order float32 sums.
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=list(ALGORITHMS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--runs", default=str(ROOT / "runs"))
    ap.add_argument("--render", action="store_true", help="only write the page and figure from the results file")
    ap.add_argument("--flow-grpo-from", metavar="DEMO_SEEDS_JSON",
                    help="take flow_grpo's runs from a scripts/demo_seeds.py results file (the same command: the "
                         "demo with no override) instead of running them again")
    args = ap.parse_args(argv)
    if args.flow_grpo_from:
        demo = json.loads(Path(args.flow_grpo_from).read_text())
        if demo.get("command", "").split() != ["digenrl", "train", "seed=N"]:
            print(f"algorithms_digits: error: --flow-grpo-from: {args.flow_grpo_from} ran {demo.get('command')!r}, "
                  "not the demo without overrides", file=sys.stderr)
            return 2
        for r in demo["runs"]:
            if r["seed"] in args.seeds:
                _record(dict(r, algorithm="flow_grpo", overrides=[]))
        args.algorithms = [a for a in args.algorithms if a != "flow_grpo"]
    if args.render:
        if not RESULTS.exists():
            print(f"algorithms_digits: error: --render: no results file {RESULTS}", file=sys.stderr)
            return 2
        data = json.loads(RESULTS.read_text())
    else:
        data = run(args.algorithms, args.seeds, Path(args.runs))
    figure(data)
    PAGE.write_text(render(data))
    print(f"wrote {PAGE} and {FIGURE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
