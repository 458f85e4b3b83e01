"""Pipeline benchmark of the Ray runtime on this CPU machine: step time, speedup, efficiency, sim fidelity.

Setup: 1 generator + 1 trainer rank (1 thread each; colocated: 2 workers that both generate and train), the
digits task with a TinyDiT sized so that generating a group (G = 8, T = 10, fragments of 4) and training it
(S = 4 trained timesteps, chunks of 8 x 2 cells) take similar time (~0.3 s each). Random weights: timing
does not depend on them. For every mode:

* ``step_time_s``: steady-state step time = (publish of the last step - publish of the first) / (K - 1),
  so the first step's pipeline fill and warm-up are excluded;
* ``speedup_vs_naive`` = naive step time / step time;
* ``efficiency`` = (busy seconds of all workers / number of workers) / elapsed, over the same window;
* ``sim_own_costs_s``: the same prediction from the op costs the run itself showed (``trace_profile``:
  ``control.observed``, mean span per action kind and size plus the mean dispatch gap): the scheduling model's
  error without the profile's measurement error;
* ``sim_step1_s``: the prediction from the op costs of the run's first step only (the spans that ended by the
  first publish, before the measured window): what ``profile_observed.json`` of a short earlier run gives;
* ``controller_cpu_s_per_step``: CPU seconds the controller process (scheduler, BTS, Ray calls) used per step;
  on this 2-core machine they are taken from the two workers, which the simulator does not model;
* ``sim_step_time_s``: the simulator's prediction of the same steady-state step time for the same plan, from
  the cost profile the run measured on its own workers before its first step (``runtime.calibration.when=
  always``, mean of ``--repeats`` per op; the run's BTS uses the same profile); ``sim_error`` = sim / measured - 1.

``--learn STEPS`` also runs the demo config (packaged base weights) in ``full`` mode (stale cap 0.25) and
reports the eval reward (written next to ``--out`` as ``<name>_learn.json``).

Each mode runs ``--rounds`` times, interleaved with the other modes, and every number of its row is the mean over
its rounds (errors: of the means; ``round_errors``: each round's own). This VM's speed drifts by 15-25% over
seconds to minutes (a plain two-process matmul loop, timed alone and beside a second one, varied that much and
showed no contention between the cores), so one run against one profile measures that drift as much as the
simulator. Ray's workers run at nice 0 here.

Run: ``python benchmarks/pipeline_cpu.py [--json] [--steps 6] [--rounds 5] [--repeats 8] [--modes ...] [--out PATH]
[--learn STEPS] [--figures docs/figures]`` (``--figures``: the runtime Gantt charts of docs/runtime.md, the naive and
gap_tsp_tag runs closest to their mode's mean).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from digenrl.schedule import MODES

MODEL = dict(dim=192, depth=6, heads=6)
WORKLOAD = ["train.prompts_per_step=8", "train.generations=8", "sampler.num_steps=10",
            "train.timestep_fraction=0.4", "runtime.fragment_size=4", "train.chunk_generations=8",
            "train.chunk_timesteps=2", "runtime.threads_per_worker=1", "runtime.max_stale_fraction=0.25",
            "eval.every=0", "eval.num_prompts=8", "eval.grid_prompts=8", "log.progress=false"]


GANTT_MODES = ("naive", "gap_tsp_tag")  # docs/runtime.md's two runtime Gantt charts (``--figures``)


def mode_overrides(mode: str) -> list[str]:
    if mode == "colocated":
        return ["runtime.mode=colocated", "runtime.trainers=2", "runtime.generators=1"]
    return [f"runtime.mode={mode}", "runtime.trainers=1", "runtime.generators=1"]


def sim_steady_step(plan, cost) -> float:
    from digenrl.sim.executor import simulate

    res = simulate(plan, cost, record=False)
    pubs = [s.published for s in res.stats]
    return (pubs[-1] - pubs[0]) / (len(pubs) - 1)


def trace_profile(run_dir: Path, sampling_steps: int, first_step_only: bool = False) -> dict:
    """A ``digenrl-profile`` of the op costs a run itself showed (``control.observed.observed_profile``): of the
    whole run, or of the spans that ended by step 1's publish (before the steady-state window)."""
    from digenrl.control.observed import observed_profile
    from digenrl.observe.trace import read_chrome_trace

    spans = read_chrome_trace(run_dir / "trace.json")
    until = None
    if first_step_only:  # step 1 ends with its publish (colocated: its commit, nothing is published)
        until = max(min(s.end for s in spans if s.kind == k) for k in ("commit", "publish")
                    if any(s.kind == k for s in spans))
    return observed_profile(spans, sampling_steps, until=until, source=f"spans of {run_dir.name}")


PER_RUN = ("step_time_s", "efficiency", "sim_step_time_s", "sim_own_costs_s", "sim_step1_s", "tag_fragments_per_step",
           "stale_fraction", "controller_cpu_s_per_step")


def one_run(base: list[str], mode: str, run_dir: Path, repeats: int, log, pools: list[str] | None = None,
            ray: bool = True) -> dict:
    """One run of ``mode``; it measures its cost profile on its own workers before its first step
    (``runtime.calibration.when=always``), and the simulator predicts it from that profile. ``pools``: the
    overrides that size its pools (default ``mode_overrides``); ``ray=False``: one colocated worker in this
    process (``digenrl train``'s in-process executor)."""
    from digenrl.config import load_config
    from digenrl.control.profile import ProfileCost, load_profile
    from digenrl.control.run_plan import plan_run
    from digenrl.runtime.driver import run_training

    load = os.getloadavg()[0]  # before the run: what else was running (the run itself adds ~1.5 on 2 cores)
    sizes = mode_overrides(mode) if pools is None else pools
    cfg = load_config(None, base + sizes + [f"run_dir={run_dir}", "runtime.calibration.when=always",
                                            f"tuning.calibration_repeats={repeats}"])
    s = run_training(cfg, ray=ray)
    plan = plan_run(cfg).plan
    sim = sim_steady_step(plan, load_profile(run_dir / "profile.json"))
    own = sim_steady_step(plan, ProfileCost.from_dict(trace_profile(run_dir, plan.sampling_steps)))
    first = sim_steady_step(plan, ProfileCost.from_dict(trace_profile(run_dir, plan.sampling_steps, True)))
    row = {"step_time_s": s["steady_step_time_s"], "efficiency": s["steady_efficiency"], "sim_step_time_s": sim,
           "sim_own_costs_s": own, "sim_step1_s": first, "tag_fragments_per_step": s["tag_fragments_per_step"],
           "stale_fraction": s["stale_fraction"], "audit_violations": len(s["audit_violations"]),
           # CPU the controller itself used per step: on this 2-core machine it competes with the workers
           "controller_cpu_s_per_step": s["controller_cpu_s"] / cfg.steps,
           # TAG modes: BTS's online factors at the end (observed / calibrated seconds per action kind)
           "cost_scales": s.get("cost_scales") or {}, "load_avg_1m_before": load}
    log(f"{mode:12s} step {row['step_time_s']:.3f} s  efficiency {row['efficiency']:.2f}  "
        f"sim {sim:.3f} s ({sim / row['step_time_s'] - 1:+.1%}), own costs {own:.3f} s "
        f"({own / row['step_time_s'] - 1:+.1%}), step 1's costs {first:.3f} s ({first / row['step_time_s'] - 1:+.1%})  TAG/step {row['tag_fragments_per_step']:.1f}  "
        f"stale {row['stale_fraction']:.0%}")
    return row


def summarize(mode: str, runs: list[dict]) -> dict:
    """A mode's row: the mean over its rounds of every per-run number; the errors are those of the means
    (mean prediction / mean measured - 1), and ``round_errors`` keeps each round's own error."""
    import statistics

    row = {"mode": mode, **{k: statistics.fmean(r[k] for r in runs) for k in PER_RUN}}
    row["sim_error"] = row["sim_step_time_s"] / row["step_time_s"] - 1.0
    row["sim_own_costs_error"] = row["sim_own_costs_s"] / row["step_time_s"] - 1.0
    row["sim_step1_error"] = row["sim_step1_s"] / row["step_time_s"] - 1.0
    row["round_step1_errors"] = [r["sim_step1_s"] / r["step_time_s"] - 1.0 for r in runs]
    row["audit_violations"] = sum(r["audit_violations"] for r in runs)
    row["rounds"] = len(runs)
    row["round_step_times_s"] = [r["step_time_s"] for r in runs]
    row["round_errors"] = [r["sim_step_time_s"] / r["step_time_s"] - 1.0 for r in runs]
    row["round_cost_scales"] = [r.get("cost_scales", {}) for r in runs]
    row["round_load_avg_1m_before"] = [r["load_avg_1m_before"] for r in runs]
    return row


def run_modes(modes, steps: int, rounds: int, work: Path, log, figures: Path | None = None,
              repeats: int = 8) -> list[dict]:
    from digenrl.models.tiny_dit import TinyDiTConfig, TinyDiTPolicy

    torch.manual_seed(0)
    model = work / "model.safetensors"
    TinyDiTPolicy(TinyDiTConfig(**MODEL)).save(model)
    base = [f"model.path={model}", f"steps={steps}", *WORKLOAD]
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(rounds):  # rounds interleave the modes: the machine's speed drifts over minutes
        for m in modes:
            runs[m].append(one_run(base, m, work / f"{m}_{r}", repeats, log))
            log(f"  (round {r + 1} of {rounds})")
    rows = [summarize(m, runs[m]) for m in modes]
    naive = rows[modes.index("naive")]["step_time_s"]
    for row in rows:
        row["speedup_vs_naive"] = naive / row["step_time_s"]
    if figures is not None:  # the Gantt charts of each mode's run closest to its mean step time
        figures.mkdir(parents=True, exist_ok=True)
        for row in (x for x in rows if x["mode"] in GANTT_MODES):
            k = min(range(rounds), key=lambda i: abs(row["round_step_times_s"][i] - row["step_time_s"]))
            shutil.copyfile(work / f"{row['mode']}_{k}" / "gantt.png", figures / f"runtime_gantt_{row['mode']}.png")
    keys = ("mode", "step_time_s", "speedup_vs_naive", "efficiency", "sim_step_time_s")
    return [{**{k: r[k] for k in keys}, **{k: v for k, v in r.items() if k not in keys}} for r in rows]


def learn(work: Path, steps: int, log) -> dict:
    """The demo config (packaged base weights) in ``full`` mode: does it still learn?"""
    from digenrl.config import load_config
    from digenrl.runtime.driver import run_training

    cfg = load_config(None, [f"run_dir={work / 'learn_full'}", f"steps={steps}", "runtime.mode=full",
                             "runtime.max_stale_fraction=0.25", "log.progress=false", "eval.every=10"])
    s = run_training(cfg, ray=True)
    rows = [json.loads(x) for x in (work / "learn_full" / "metrics.jsonl").read_text().splitlines()]
    out = {"mode": "full", "steps": steps, "eval_reward_initial": s["eval_reward_initial"],
           "eval_reward_final": s["eval_reward_final"], "stale_fraction": s["stale_fraction"],
           "train_reward_first": rows[1]["reward_mean"], "train_reward_last": rows[-2]["reward_mean"],
           "wall_s": s["wall_s"]}
    log(f"learn (full, {steps} steps): eval {out['eval_reward_initial']:.3f} -> {out['eval_reward_final']:.3f}, "
        f"train reward {out['train_reward_first']:.3f} -> {out['train_reward_last']:.3f}")
    return out


def markdown_table(rows: list[dict]) -> str:
    """The table of a results file (docs/benchmarks.md): step time, speedup, efficiency, simulator prediction and error."""
    out = ["| mode | step (s) | vs naive | pipeline efficiency | sim, calibration (s) | error | error per round | "
           "sim, step 1's op costs | sim, run's own op costs |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name = "colocated (2 workers)" if r["mode"] == "colocated" else r["mode"]
        own = f"{r['sim_own_costs_s']:.3f} ({r['sim_own_costs_error']:+.1%})" if "sim_own_costs_s" in r else "-"
        first = f"{r['sim_step1_s']:.3f} ({r['sim_step1_error']:+.1%})" if "sim_step1_s" in r else "-"
        per = " / ".join(f"{e:+.0%}" for e in r.get("round_errors", []))
        out.append(f"| {name} | {r['step_time_s']:.3f} | {r['speedup_vs_naive']:.2f}x | {r['efficiency']:.2f} | "
                   f"{r['sim_step_time_s']:.3f} | {r['sim_error']:+.1%} | {per or '-'} | {first} | {own} |")
    order = lambda key: " < ".join(r["mode"] for r in sorted(rows, key=lambda r: r[key]))  # noqa: E731
    line = f"Fastest first, measured: {order('step_time_s')}; simulated from the calibration: {order('sim_step_time_s')}"
    for key, what in (("sim_step1_s", "step 1's op costs"), ("sim_own_costs_s", "the run's own op costs")):
        if all(key in r for r in rows):
            line += f"; from {what}: {order(key)}"
    out += ["", line + "."]
    return "\n".join(out + ["", summary(rows)])


def ranks_as_measured(rows: list[dict], key: str) -> bool:
    """Do the predictions ``key`` order the modes as their measured step times do?"""
    def order(k: str) -> list[str]:
        return [r["mode"] for r in sorted(rows, key=lambda r: r[k])]

    return order(key) == order("step_time_s")


def ordered_as_measured(pairs: list[tuple[dict, dict]], key: str) -> int:
    """How many of ``pairs`` the predictions ``key`` order as the measurement does."""
    return sum((a[key] < b[key]) == (a["step_time_s"] < b["step_time_s"]) for a, b in pairs)


def distinguishable_pairs(rows: list[dict]) -> list[tuple[dict, dict]] | None:
    """Pairs of modes whose measured mean step times differ by more than 2 x the standard error of the
    difference (from the spread of each mode's rounds): the pairs a ranking can be checked on. None with one round."""
    import statistics

    if any(len(r.get("round_step_times_s", [])) < 2 for r in rows):
        return None
    se2 = {r["mode"]: statistics.variance(r["round_step_times_s"]) / len(r["round_step_times_s"]) for r in rows}
    return [(a, b) for i, a in enumerate(rows) for b in rows[i + 1:]
            if abs(a["step_time_s"] - b["step_time_s"]) > 2 * (se2[a["mode"]] + se2[b["mode"]]) ** 0.5]


def workers(mode: str) -> int:
    """Workers of a mode's run (``mode_overrides``): the denominator of its pipeline efficiency."""
    n = {o.split("=")[0]: o.split("=")[1] for o in mode_overrides(mode)}
    return int(n["runtime.trainers"]) + (0 if mode == "colocated" else int(n["runtime.generators"]))


def busy_per_step(row: dict) -> float:
    """Busy worker-seconds per step: efficiency = busy / (workers x step time), so busy = efficiency x workers x step."""
    return row["efficiency"] * workers(row["mode"]) * row["step_time_s"]


def work_split(rows: list[dict]) -> list[str]:
    """Full's speedup over naive, split exactly into its two factors (both runs have the same number of workers):
    step_naive / step_full = (efficiency_full / efficiency_naive) x (busy_naive / busy_full)."""
    by = {r["mode"]: r for r in rows}
    if not {"naive", "full"} <= by.keys():
        return []
    naive, full = by["naive"], by["full"]
    out = [f"Full's speedup over naive is the product of two measured factors: the pipeline efficiencies, "
           f"{full['efficiency']:.3f} over {naive['efficiency']:.3f} ({full['efficiency'] / naive['efficiency']:.2f}x, "
           f"what the schedule gains), and the busy worker-seconds per step, {busy_per_step(naive):.2f} s of naive over "
           f"{busy_per_step(full):.2f} s of full ({busy_per_step(naive) / busy_per_step(full):.2f}x: the same ops, "
           f"timed in different runs and with both cores busy in full's); together {full['speedup_vs_naive']:.2f}x."]
    if "colocated" in by:
        out.append(f"Colocated (two workers sharing every group and all-reducing the gradients) spent {busy_per_step(by['colocated']):.2f} "
                   f"busy worker-seconds per step ({busy_per_step(by['colocated']) / busy_per_step(naive) - 1:+.0%} "
                   "over naive).")
    return out


def load_range(rows: list[dict]) -> tuple[float, float] | None:
    """(min, max) of the 1-min load averages recorded before the runs of ``rows``; None for a results file written
    before the field."""
    loads = [x for r in rows for x in r.get("round_load_avg_1m_before", [])]
    return (min(loads), max(loads)) if loads else None


def summary(rows: list[dict]) -> str:
    """The paragraph under the table (docs/benchmarks.md): every number is a value of the results file."""
    same = lambda key: ranks_as_measured(rows, key)  # noqa: E731
    worst = lambda key: max(abs(r[key]) for r in rows)  # noqa: E731
    text = []
    if all("sim_own_costs_error" in r for r in rows):
        text.append(f"Given the op costs a run actually had, the simulator predicts its step time within "
                    f"{worst('sim_own_costs_error'):.1%} in every mode, and ranks the modes "
                    f"{'as measured' if same('sim_own_costs_s') else 'differently from the measurement'}.")
    if all("sim_step1_error" in r for r in rows):
        text.append(f"From the costs of each run's first step (before the measured window) it is within "
                    f"{worst('sim_step1_error'):.1%} on average over the runs (ranking "
                    f"{'as measured' if same('sim_step1_s') else 'not as measured'}).")
    text.append(f"From the calibration timed just before each run it is within {worst('sim_error'):.1%} on average "
                f"(ranking {'as measured' if same('sim_step_time_s') else 'not as measured'})")
    per = [x for r in rows for x in r.get("round_errors", [])]
    if per:
        text[-1] += f", and a single run is {min(per):+.0%} to {max(per):+.0%} off its own calibration"
    text[-1] += "."
    pairs = distinguishable_pairs(rows)
    if pairs is not None:
        keys = [(k, what) for k, what in (("sim_step_time_s", "the calibration"), ("sim_step1_s", "step 1's costs"),
                                          ("sim_own_costs_s", "the own costs")) if all(k in r for r in rows)]
        agree = [f"{ordered_as_measured(pairs, k)} from {what}"
                 for k, what in keys]
        text.append(f"{len(pairs)} of the {len(rows) * (len(rows) - 1) // 2} pairs of modes differ by more than twice "
                    "the standard error of their measured means; of these the simulator orders as measured "
                    + ", ".join(agree) + ".")
    spread = [max(r["round_step_times_s"]) / min(r["round_step_times_s"]) - 1 for r in rows if len(r.get("round_step_times_s", [])) > 1]
    if spread:
        text.append(f"The same mode's measured step time differs by up to {max(spread):.0%} between its runs "
                    "(machine drift on this shared VM, not the simulator).")
    scales: dict[str, list[float]] = {}
    for r in rows:
        for sc in r.get("round_cost_scales", []):
            for k, v in sc.items():
                scales.setdefault(k, []).append(v)
    if scales.get("generate/generator") and scales.get("train"):
        text.append("In the TAG modes BTS's online factors (the runs' own action times over their calibration's, "
                    "`cost_scale/<kind>`) ended at " + ", ".join(
                        f"{k} x{min(v):.2f}-{max(v):.2f}" for k, v in sorted(scales.items())
                        if k in ("generate/generator", "generate/trainer", "train", "commit")) + ".")
    text += work_split(rows)
    loads = load_range(rows)
    if loads is not None:
        text.append(f"The 1-min load average before each run was {loads[0]:.1f}-{loads[1]:.1f}.")
    cpu = [r["controller_cpu_s_per_step"] for r in rows if "controller_cpu_s_per_step" in r]
    if cpu:
        text.append(f"The controller uses {min(cpu):.2f}-{max(cpu):.2f} CPU-seconds per step "
                    "(`controller_cpu_s_per_step`), taken from the workers' two cores here.")
    return " ".join(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6, help="optimizer steps per mode (default 6)")
    ap.add_argument("--modes", nargs="+", default=list(MODES))
    ap.add_argument("--rounds", type=int, default=5, help="runs per mode, interleaved; rows are their means")
    ap.add_argument("--repeats", type=int, default=8, help="timed repeats per op of each run's pre-run profile")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--out", default=None, help="also write the rows here (e.g. benchmarks/results/pipeline_cpu.json)")
    ap.add_argument("--learn", type=int, default=0, metavar="STEPS", help="also run the demo in full mode")
    ap.add_argument("--keep", default=None, help="keep the run directories here")
    ap.add_argument("--figures", default=None, metavar="DIR",
                    help="copy the Gantt charts of the reported naive and gap_tsp_tag runs to DIR/runtime_gantt_<mode>.png")
    ap.add_argument("--table", default=None, metavar="RESULTS",
                    help="print the markdown table (docs/benchmarks.md) from a results file and exit (no runs)")
    args = ap.parse_args(argv)
    if args.table:
        print(markdown_table(json.loads(Path(args.table).read_text())))
        return 0
    if "naive" not in args.modes:
        args.modes = ["naive"] + list(args.modes)
    torch.set_num_threads(1)
    # Ray runs its workers at nice 15; on a machine shared with other nice-0 jobs that would measure them,
    # not the pipeline. The benchmark's workers run at nice 0 like the driver.
    os.environ.setdefault("RAY_worker_niceness", "0")
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    log = (lambda msg: print(msg, file=sys.stderr)) if args.json else print
    quiet = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    try:  # (--json: the runs' step lines go to stderr, so that stdout is the JSON alone)
        with quiet, tempfile.TemporaryDirectory() as tmp:
            work = Path(args.keep or tmp)
            work.mkdir(parents=True, exist_ok=True)
            rows = run_modes(args.modes, args.steps, args.rounds, work, log,
                             Path(args.figures) if args.figures else None, args.repeats)
            learned = learn(work, args.learn, log) if args.learn else None
    finally:
        ray.shutdown()
    if args.json:
        print(json.dumps(rows, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
        if learned:
            Path(args.out).with_name(Path(args.out).stem + "_learn.json").write_text(json.dumps(learned, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
