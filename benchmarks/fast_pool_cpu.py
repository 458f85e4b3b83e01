"""Disaggregation with an inference-optimised generator pool against colocation, measured end to end on this CPU.

On one kind of worker, colocation runs the same ops as a disaggregated run with fewer bubbles; the simulator finds it
as fast or faster (docs/where_disaggregation_wins.md). What a separate generator pool can do that a colocated worker
cannot is hold the policy in a form built for generation (``generator.*``, docs/fast_generator.md): a colocated
worker samples with its training weights. This script measures whether that wins a whole step on this machine's
two cores, with the same math on both sides.

Workload: the FLUX.1 architecture with random weights at ``benchmarks/fast_generator.py``'s size (width 512 =
4 heads x 128, 2 double-stream + 4 single-stream blocks, 128 px, 128 text tokens as a prompt cache of random
embeddings, guidance embedding 3.5), LoRA rank 32 / alpha 64 on Flow-GRPO's FLUX targets (``model.lora``'s
default), 2 prompts (``--prompts``) x 4 generations, T = 10 sampling steps of which 2 are trained
(``train.timestep_fraction`` 0.2: a generation-heavy step, like MixGRPO's window of 4 of its 25 steps,
``configs/flux1_dev_mixgrpo.yaml``), fragments of 2 (``--fragment``), the JPEG-incompressibility reward, float32,
one thread per worker, two workers. Variants:

* ``colocated``: ``runtime.mode=colocated``, 2 workers; each samples its share of the step in one batch with its
  training model (LoRA unmerged, eager) and trains its share, gradients all-reduced: the shape of flow_grpo's and
  DanceGRPO's loop, with larger batches than theirs;
* ``colocated_flow_grpo``: the same, batched as flow_grpo's FLUX recipe (``pickscore_flux``): sampling 3 at a time
  (its per-GPU ``sample.train_batch_size``: ``sampler.batch_size=3``) and training one timestep per
  forward/backward (chunks of 3 generations x 1 timestep; a chunk stays inside one prompt group, where flow_grpo's
  micro-batch of 3 may span two). Still DigenRL's runtime and math, not flow_grpo's code;
* ``gap_tsp_tag``: 1 generator + 1 trainer rank; the generator holds the same eager, unmerged form;
* ``gap_tsp_tag_fast``: the same, with the generator's inference copy merged and compiled
  (``generator.merge_lora``, ``generator.compile=default``). Still float32: a bfloat16 copy is left out, because
  a GPU peer samples in bf16 as well, so it would not compare like with like;
* ``full_fast``: the same generator in ``runtime.mode=full`` (stale cap 0.25): DigenRL's whole stack, whose TCSS
  trains up to a quarter of a step's samples one version stale, so not the same math as the three above.

Each variant runs ``--rounds`` times, interleaved; per run the steady step time (``pipeline_cpu.one_run``: the
publishes of the first and last step over K - 1), the pipeline efficiency, and the simulator's prediction from
the run's own calibration (``runtime.calibration.when=always``: the generator's ops timed on its inference copy).
Every number of a row is the mean over its rounds, and the load average before each run is recorded.

    python benchmarks/fast_pool_cpu.py [--prompts 2] [--fragment 2] [--steps 8] [--rounds 3] [--repeats 2] [--out ...]
    python benchmarks/fast_pool_cpu.py --table [--out ...]     # the Markdown table of an existing results file

``--prompts`` sets the prompts per step and ``--fragment`` the generator's batch (defaults 2 and 2, written to
``fast_pool_cpu.json``; other values to ``fast_pool_cpu_p<N>_f<F>.json``, naming those that differ). A colocated
worker samples its whole share in one batch whatever the fragment size, and on a CPU a larger batch samples each
trajectory faster; with few prompt groups per step the disaggregated pipeline's tail (the last group's training,
the commit and the publish, while the generator waits) is a large share of the step.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # flux_random, pipeline_cpu
OUT = HERE / "results" / "fast_pool_cpu.json"

PROMPTS = [f"a photo of prompt {i}" for i in range(8)]
TEXT_TOKENS, PX = 128, 128
WORKLOAD = ["model.kind=flux", "model.lora.enabled=true", "model.lora.rank=32", "model.lora.alpha=64",
            f"model.options={{height: {PX}, width: {PX}, max_sequence_length: {TEXT_TOKENS}}}", "task.name=text",
            "reward={jpeg_incompressibility: {weight: 1.0}}", "sampler.num_steps=10", "sampler.cfg_scale=3.5",
            "train.timestep_fraction=0.2", "train.generations=4",
            "runtime.threads_per_worker=1", "train.ema_decay=null", "eval.num_prompts=2",
            "eval.grid_prompts=2", "eval.every=0", "log.progress=false"]
FAST = ["generator.merge_lora=true", "generator.compile=default"]  # the generator's inference copy
FLOW_GRPO = ["sampler.batch_size=3", "train.chunk_generations=3", "train.chunk_timesteps=1"]  # pickscore_flux batches
VARIANTS = {  # name -> (runtime.mode, extra overrides)
    "colocated": ("colocated", []),
    "colocated_flow_grpo": ("colocated", FLOW_GRPO),
    "gap_tsp_tag": ("gap_tsp_tag", []),
    "gap_tsp_tag_fast": ("gap_tsp_tag", FAST),
    "full_fast": ("full", [*FAST, "runtime.max_stale_fraction=0.25"]),
}
WHAT = {
    "colocated": "2 workers, each samples its share in one batch with its training model (LoRA unmerged, eager), "
                 "then trains it",
    "colocated_flow_grpo": "the same 2 workers batched as flow_grpo's FLUX recipe: sampling 3 at a time, training "
                           "one timestep per forward/backward",
    "gap_tsp_tag": "1 generator + 1 trainer rank, the generator eager and unmerged",
    "gap_tsp_tag_fast": "1 generator + 1 trainer rank, the generator merged and compiled",
    "full_fast": "the same in `full`: TCSS lets up to 25% of a step's samples be one version stale (not the same "
                 "math as the rows above)",
}


def save_model(root: Path) -> list[str]:
    """The random-weight FLUX pipeline (no text encoders), its prompt cache and prompt file under ``root``; returns
    the config overrides that point at them."""
    from diffusers import AutoencoderKL
    from flux_random import FLUX_VAE_FACTORS, flux_transformer, save_pipeline

    torch.manual_seed(0)
    tr = flux_transformer(2, 4, num_attention_heads=4)
    vae = AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                        block_out_channels=(8,) * 4, latent_channels=16, norm_num_groups=4, **FLUX_VAE_FACTORS)
    return save_pipeline(root, tr, vae, PROMPTS, TEXT_TOKENS)


def setting(report: dict, key: str, kind=int, overrides: list[str] | None = None):
    """A setting of a results file's workload (its overrides; or of a row's ``overrides``), e.g.
    ``train.prompts_per_step``."""
    found = report["workload"] if overrides is None else overrides
    return kind(next(o for o in found if o.startswith(f"{key}=")).split("=")[1])


def measure(base: list[str], steps: int, rounds: int, repeats: int, work: Path, log) -> list[dict]:
    import pipeline_cpu

    base = [*base, *save_model(work), f"steps={steps}"]
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for r in range(rounds):  # interleaved: the machine's speed drifts over minutes
        for name, (mode, extra) in VARIANTS.items():
            runs[name].append(pipeline_cpu.one_run(base + extra, mode, work / f"{name}_{r}", repeats, log))
            log(f"  ({name}, round {r + 1} of {rounds})")
    rows = []
    for name, (mode, extra) in VARIANTS.items():
        row = pipeline_cpu.summarize(name, runs[name])
        rows.append({"variant": name, "mode": mode, "overrides": extra,
                     **{k: v for k, v in row.items() if k != "mode"}})
    co = rows[0]["step_time_s"]
    for row in rows:
        row["speedup_vs_colocated"] = co / row["step_time_s"]
        row["round_speedups_vs_colocated"] = [c / s for c, s in zip(rows[0]["round_step_times_s"],
                                                                    row["round_step_times_s"])]
    return rows


def table(report: dict) -> str:
    rows = report["rows"]
    out = ["| variant | what runs | step (s) | per round (s) | vs colocated | pipeline efficiency | TAG fragments "
           "per step | stale samples | simulated from the calibration (s) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        per = " / ".join(f"{t:.2f}" for t in r["round_step_times_s"])
        out.append(f"| `{r['variant']}` | {WHAT[r['variant']]} | {r['step_time_s']:.2f} | {per} | "
                   f"{r['speedup_vs_colocated']:.2f}x | {r['efficiency']:.2f} | {r['tag_fragments_per_step']:.2f} | "
                   f"{r['stale_fraction']:.0%} | "
                   f"{r['sim_step_time_s']:.2f} ({r['sim_error']:+.1%}) |")
    return "\n".join(out + ["", headline(report)])


def headline(report: dict) -> str:
    """The sentence under each table (docs/fast_generator.md) and in the README, written from the results."""
    import pipeline_cpu

    by = {r["variant"]: r for r in report["rows"]}
    fast, plain = by["gap_tsp_tag_fast"], by["gap_tsp_tag"]
    rows = [dict(r, mode=r["variant"]) for r in report["rows"]]
    pairs = pipeline_cpu.distinguishable_pairs(rows) or []
    clear = {frozenset((a["mode"], b["mode"])) for a, b in pairs}
    apart = "more" if frozenset(("colocated", "gap_tsp_tag_fast")) in clear else "not more"
    sim = " < ".join(r["variant"] for r in sorted(report["rows"], key=lambda r: r["sim_step_time_s"]))
    meas = " < ".join(r["variant"] for r in sorted(report["rows"], key=lambda r: r["step_time_s"]))
    loads = [x for r in report["rows"] for x in r["round_load_avg_1m_before"]]
    p, f = setting(report, "train.prompts_per_step"), setting(report, "runtime.fragment_size")
    g, t = setting(report, "train.generations"), setting(report, "sampler.num_steps")
    trained = int(t * setting(report, "train.timestep_fraction", float))  # Flow-GRPO's int(T x fraction)
    flag = ("" if p == 2 else f" --prompts {p}") + ("" if f == 2 else f" --fragment {f}")
    peer = peer_sentence(report)
    return (f"Measured on this CPU (`python benchmarks/fast_pool_cpu.py{flag}`, {report['rounds']} interleaved "
            f"rounds of {report['steps']} steps, 1-min load {min(loads):.1f}-{max(loads):.1f} before the runs), a "
            f"generation-heavy LoRA step (FLUX architecture with random weights, {p} prompts x {g} generations, T = "
            f"{t} of which {trained} trained, float32 on both sides) on 1 generator sampling fragments of {f} + 1 "
            f"trainer rank against colocated on the same 2 workers (each sampling its whole share, {p * g // 2} "
            f"trajectories, in one "
            f"batch with its training model, LoRA unmerged, then training it): "
            f"`gap_tsp_tag` (the same math) **{fast['speedup_vs_colocated']:.2f}x** with a merged, compiled "
            f"generator ({round_range(fast)} per round; the difference is {apart} than twice its standard error) and "
            f"{plain['speedup_vs_colocated']:.2f}x with an eager, unmerged one; `full` (TCSS: some samples one "
            f"version stale) **{by['full_fast']['speedup_vs_colocated']:.2f}x** ({round_range(by['full_fast'])} per "
            f"round) with the fast generator. Fastest "
            f"first, measured: {meas}; simulated from each run's calibration: {sim}." + (" " + peer if peer else ""))


def round_range(row: dict, over: list[float] | None = None) -> str:
    """'lo-hi x' of a row's per-round ratios: its speedups over colocation, or ``over`` (a baseline's round step
    times) divided by its round step times. Shown beside a mean so that one slow round is seen as one."""
    per = (row["round_speedups_vs_colocated"] if over is None
           else [b / s for b, s in zip(over, row["round_step_times_s"])])
    return f"{min(per):.2f}-{max(per):.2f}x"


def peer_sentence(report: dict, workload: bool = False) -> str:
    """The sentence on the ``colocated_flow_grpo`` row ('' where a results file has none: written before it), with
    the workload named first where ``workload`` (the README's line on a workload other than the default)."""
    by = {r["variant"]: r for r in report["rows"]}
    peer, fast = by.get("colocated_flow_grpo"), by["gap_tsp_tag_fast"]
    if peer is None:
        return ""
    fg = peer["step_time_s"]
    lead = "Against"
    if workload:
        p, f = setting(report, "train.prompts_per_step"), setting(report, "runtime.fragment_size")
        lead = (f"On this CPU with {p} prompts per step and fragments of {f} (`python benchmarks/fast_pool_cpu.py "
                f"--prompts {p} --fragment {f}`, {report['rounds']} interleaved rounds of {report['steps']} steps), "
                "against")
    batch = setting(report, "sampler.batch_size", overrides=peer["overrides"])
    return (f"{lead} colocated batched as flow_grpo's FLUX recipe (sampling {batch} at a time, one timestep per "
            f"forward/backward; {peer['speedup_vs_colocated']:.2f}x the speed of colocation as DigenRL runs it): "
            f"`gap_tsp_tag` (the same math) with the fast generator **{fg / fast['step_time_s']:.2f}x** "
            f"({round_range(fast, peer['round_step_times_s'])} per round), "
            f"`full` **{fg / by['full_fast']['step_time_s']:.2f}x** "
            f"({round_range(by['full_fast'], peer['round_step_times_s'])} per round).")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=2, help="prompts per step (train.prompts_per_step)")
    ap.add_argument("--fragment", type=int, default=2, help="generations per fragment (runtime.fragment_size): the "
                    "batch a generator samples; a colocated worker samples its whole share in one batch whatever it is")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2, help="calibration repeats per op (tuning.calibration_repeats)")
    ap.add_argument("--out", default=None, help="default: results/fast_pool_cpu.json (2 prompts, fragments of 2), "
                                                "else fast_pool_cpu_p<N>_f<F>.json (the values that differ)")
    ap.add_argument("--table", action="store_true", help="print the Markdown table of --out and exit")
    args = ap.parse_args(argv)
    tail = ("" if args.prompts == 2 else f"_p{args.prompts}") + ("" if args.fragment == 2 else f"_f{args.fragment}")
    args.out = args.out or str(OUT.with_name(f"fast_pool_cpu{tail}.json"))
    if args.table:
        print(table(json.loads(Path(args.out).read_text())))
        return 0
    if args.steps < 3 or args.rounds < 1 or args.prompts < 1 or args.fragment < 1:
        ap.error("--steps must be >= 3 (a steady window), --rounds, --prompts and --fragment >= 1")
    workload = [*WORKLOAD, f"train.prompts_per_step={args.prompts}", f"runtime.fragment_size={args.fragment}"]
    t0 = time.time()
    load = os.getloadavg()[0]

    def log(msg: str) -> None:
        print(f"[{time.time() - t0:6.0f}s] {msg}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(workload, args.steps, args.rounds, args.repeats, Path(tmp), log)
    report = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
              "steps": args.steps, "rounds": args.rounds, "calibration_repeats": args.repeats,
              "workload": workload, "variants": {k: {"mode": m, "overrides": e} for k, (m, e) in VARIANTS.items()},
              "load_avg_1m_before": load, "load_avg_1m_after": os.getloadavg()[0], "seconds": round(time.time() - t0),
              "rows": rows}
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(table(report))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
