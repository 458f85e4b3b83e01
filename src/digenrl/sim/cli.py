"""``digenrl simulate``: compare the execution modes of one workload in virtual time.

Prints a table (or ``--json`` rows) per mode: step time, speedup over ``naive`` and over ``colocated``,
generator and trainer idle shares, TAG fragments per step and stale share; optionally writes a Chrome trace
and a Gantt chart of one mode. On the roofline path every row also carries the colocated baselines as the
peers run them (``sim.baselines``: the idealised bound, flow_grpo's loop where flow_grpo has a config for the
model, DanceGRPO's loop), each with its label, the training it runs, its cited config, its step time and the
mode's speedup over it (``baselines`` in ``--json``; printed under the table). Without ``--gen-gpus`` every disaggregated mode gets its own best
generator/trainer split (reported). Bad input exits with code 2 before anything is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from ..cli_args import add_overrides, parse_with_overrides
from ..control.profile import ProfileError, load_profile, profile_pools
from ..control.timeline import RunResult
from ..schedule import MODES, TAG_POLICIES, BTSConfig, Mode
from .algorithms import Algorithm, AlgorithmError
from .assumptions import ATTN_BACKWARD_FACTOR, Assumptions
from .baselines import baselines as peer_baselines
from .comm import EXPOSED_COMM_SHARE
from .scenario import ModeRun, Scenario, ScenarioError, run_mode
from .presets import PresetError, Training, model_preset, testbed_preset, workload_preset


class CliError(ValueError):
    pass


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="digenrl simulate", description="Compare the execution modes of one workload in virtual time: a model preset on a GPU testbed (roofline), or a config with a measured profile or a testbed.")
    ap.add_argument("--model", default=None, help="flux | wan | hunyuan_video | qwen_image | sd3 (roofline path; also the aliases hunyuan, qwen-image, sd35-medium), or a native-size video preset: hunyuan_video_native | wan_native")
    ap.add_argument("--testbed", default=None, help="A | B | C | A+C (roofline path)")
    ap.add_argument("--config", default=None,
                    help="simulate this run config's own plan (use 'default' for the built-in demo) with --profile or "
                         "on --testbed (roofline; --gpus keeps the config's generator:trainer ratio)")
    ap.add_argument("--gpus", type=int, default=None, help="GPUs used (default: the whole testbed)")
    ap.add_argument("--gen-gpus", type=int, default=None, help="generator GPUs (default: searched per mode)")
    ap.add_argument("--sampling-steps", type=int, default=None, help="T (default 20)")
    ap.add_argument("--timestep-fraction", type=float, default=None, help="trained share of T (default 0.6)")
    ap.add_argument("--prompts", type=int, default=None, help="P prompts per step (model default)")
    ap.add_argument("--generations", type=int, default=None, help="G generations per prompt (model default)")
    ap.add_argument("--algorithm", default="flow_grpo",
                    help="train.algorithm priced: flow_grpo | grpo_guard | mixgrpo | nft (default flow_grpo)")
    ap.add_argument("--window", type=int, default=4, help="mixgrpo: SDE window w, the trained steps (default 4)")
    ap.add_argument("--flash-ratio", type=float, default=1.0,
                    help="mixgrpo: MixGRPO-Flash's post_compress_ratio (recipe 0.4; default 1.0: no Flash)")
    ap.add_argument("--nft-timesteps", type=int, default=None,
                    help="nft: training timesteps K per sample (default int(0.99 T))")
    ap.add_argument("--nft-old-policy", default="soft",
                    help="nft: old policy soft (a swapped-in copy: one more forward per cell; default) | current")
    ap.add_argument("--lora-rank", type=int, default=0,
                    help="0: full fine-tuning, FSDP (default); R > 0: LoRA rank R on replicated trainers")
    ap.add_argument("--exposed-comm", type=float, default=EXPOSED_COMM_SHARE,
                    help=f"share of overlapped communication left exposed, in [0, 1] (default {EXPOSED_COMM_SHARE})")
    ap.add_argument("--attn-backward", type=float, default=ATTN_BACKWARD_FACTOR,
                    help=f"attention backward FLOPs over forward (default {ATTN_BACKWARD_FACTOR}: FlashAttention-2)")
    ap.add_argument("--no-baselines", action="store_true", help="skip the peer baselines (roofline path)")
    ap.add_argument("--modes", nargs="+", default=list(MODES), help=f"subset of: {' '.join(MODES)}")
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps simulated (default 20)")
    ap.add_argument("--max-stale-fraction", type=float, default=0.5, help="TCSS cap for 'full' (default 0.5)")
    ap.add_argument("--jitter", type=float, default=0.0, help="log-normal sigma of op-time noise (default 0)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the --jitter noise (default 0)")
    ap.add_argument("--tag-policy", default="auto",
                    help="TAG decisions: auto | bts | greedy | none (default auto: greedy with TCSS, else bts)")
    ap.add_argument("--bts-depth", type=int, default=None, help=f"BTS search depth (default {BTSConfig.depth})")
    ap.add_argument("--bts-budget-nodes", type=int, default=None,
                    help=f"BTS search nodes per decision (default {BTSConfig.budget_nodes}; deterministic)")
    ap.add_argument("--profile", default=None, help="measured cost profile JSON (replaces the roofline)")
    ap.add_argument("--search", action="store_true",
                    help="--config: give each mode the planner's choice on the config's GPUs (what digenrl plan writes "
                         "for that mode) instead of the config's own plan")
    ap.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    ap.add_argument("--trace", default=None, help="write a Chrome trace (Perfetto) of --trace-mode here")
    ap.add_argument("--gantt", default=None, help="write a Gantt PNG of --trace-mode here")
    ap.add_argument("--trace-mode", default=None, help="mode drawn by --trace/--gantt (default: last of --modes)")
    ap.add_argument("--gantt-steps", type=int, default=3, help="steps shown in the Gantt chart (default 3)")
    return add_overrides(ap)  # config overrides for --config: --set KEY=VALUE (repeatable) or KEY=VALUE


def _check_modes(args) -> None:
    for m in args.modes:
        if m not in MODES:
            raise CliError(f"--modes: unknown mode {m!r} (choose from {', '.join(MODES)})")
    if args.trace_mode is not None and args.trace_mode not in args.modes:
        raise CliError(f"--trace-mode: {args.trace_mode!r} is not among --modes")


def at_least(args, opt: str, lo):
    """``args.<opt>`` (None when not given), refused below ``lo``."""
    v = getattr(args, opt)
    if v is not None and v < lo:
        raise CliError(f"--{opt.replace('_', '-')}: must be >= {lo} (got {v})")
    return v


def bts_of(args) -> BTSConfig:
    """--tag-policy / --bts-depth / --bts-budget-nodes as the scheduler's ``BTSConfig``."""
    if args.tag_policy not in TAG_POLICIES:
        raise CliError(f"--tag-policy: unknown policy {args.tag_policy!r} (choose from {', '.join(TAG_POLICIES)})")
    opts = {"policy": args.tag_policy}
    for opt, key, lo in (("bts_depth", "depth", 0), ("bts_budget_nodes", "budget_nodes", 1)):
        if at_least(args, opt, lo) is not None:
            opts[key] = getattr(args, opt)
    return BTSConfig(**opts)


def _setup(args) -> Scenario:
    model = model_preset(args.model)
    testbed = testbed_preset(args.testbed)
    _check_modes(args)
    gpus = testbed.total if args.gpus is None else args.gpus  # (the range: Scenario's check)
    if args.gen_gpus is not None and not 1 <= args.gen_gpus < gpus:
        raise CliError(f"--gen-gpus: {args.gen_gpus} must be at least 1 and less than --gpus ({gpus})")
    w = workload_preset(args.model)
    changes = {f: getattr(args, f) for f in ("sampling_steps", "prompts", "generations")
               if at_least(args, f, 1) is not None}
    if args.timestep_fraction is not None:
        if not 0.0 < args.timestep_fraction <= 1.0:
            raise CliError(f"--timestep-fraction: must lie in (0, 1] (got {args.timestep_fraction})")
        changes["timestep_fraction"] = args.timestep_fraction
    if args.nft_old_policy != "soft" and args.algorithm != "nft":
        raise CliError("--nft-old-policy: DiffusionNFT's old policy needs --algorithm nft")
    changes["algorithm"] = Algorithm(args.algorithm, args.window, args.flash_ratio, args.nft_timesteps,
                                     args.nft_old_policy)  # (an AlgorithmError names the option)
    replace(w, **changes).trained_timesteps  # MixGRPO's window and DiffusionNFT's K checked against T
    if at_least(args, "lora_rank", 0):
        changes["training"] = Training(lora_rank=args.lora_rank, sharded=False)
    try:
        assume = Assumptions(args.exposed_comm, args.attn_backward)
    except ValueError as e:
        raise CliError(f"--{str(e).split(':')[0].replace('_', '-')}:{str(e).split(':', 1)[1]}") from None
    if not 0.0 <= args.max_stale_fraction <= 1.0:
        raise CliError(f"--max-stale-fraction: must lie in [0, 1] (got {args.max_stale_fraction})")
    at_least(args, "jitter", 0)
    at_least(args, "gantt_steps", 1)
    return Scenario(model, testbed, replace(w, **changes), gpus, args.steps, args.max_stale_fraction,
                    assume=assume, **(measured_profile(args.profile) if args.profile else {}))


def measured_profile(path: str) -> dict:
    """The profile at ``path`` and the trainer ranks it was measured at (``Scenario`` / ``ConfigSource`` keywords)."""
    return {"profile": load_profile(path), "profile_trainers": profile_pools(path)[1]}


def cost_source(args) -> tuple[dict, str]:
    """``--config``: exactly one of ``--profile`` (measured) and ``--testbed`` (roofline), as ``ConfigSource``'s
    keywords and the words naming it."""
    if (args.profile is None) == (args.testbed is None):
        raise CliError("--profile: give exactly one of --profile (measured costs, e.g. from `digenrl profile`) "
                       "or --testbed (roofline of a GPU testbed) with --config")
    if args.profile is not None:
        return measured_profile(args.profile), f"profile {args.profile}"
    tb = testbed_preset(args.testbed)
    return {"testbed": tb}, f"testbed {tb.name} ({tb.description})"


def run_modes(setup: Scenario, modes: list[str], gen_gpus: int | None, jitter: float = 0.0, seed: int = 0,
              record_mode: str | None = None, bts: BTSConfig | None = None) -> dict[str, ModeRun]:
    """Every requested mode plus the two baselines (``naive``, ``colocated``) needed for the speedups."""
    return {m: run_mode(setup, m, gen_gpus if m != "colocated" else None, jitter, seed, bts=bts,
                        record=(m == record_mode)) for m in dict.fromkeys(list(modes) + ["naive", "colocated"])}


def training_words(t: Training) -> str:
    if t.lora_rank:
        return f"LoRA r{t.lora_rank}, " + ("FSDP" if t.sharded else "replicated (DDP)")
    return "full fine-tuning, " + ("FSDP" if t.sharded else "replicated")


def run_baselines(setup: Scenario, bts: BTSConfig | None = None) -> list[dict]:
    """Each peer baseline of ``setup``'s model (``sim.baselines``) run colocated on all of ``setup.gpus``."""
    key = setup.model.spec.kind
    out = []
    for b in peer_baselines(key, setup.workload.training):
        rec = {"name": b.name, "label": b.label, "training": training_words(b.training), "source": b.source,
               "same_training": b.training == setup.workload.training}
        s = replace(setup, workload=replace(setup.workload, training=b.training), variant=b.variant)
        try:
            r = run_mode(s, "colocated", bts=bts)
            rec.update(step_time_s=r.result.step_time, gpus=r.n_train, note=r.note)
        except ScenarioError as e:
            rec["error"] = str(e)
        out.append(rec)
    return out


def rows_of(runs: dict, modes: list[str], baselines: list[dict] | None = None) -> list[dict]:
    """One row per mode of ``runs`` (``scenario.ModeRun``). ``baselines`` (``run_baselines``): each row carries each
    one's step time and the mode's speedup over it (``baseline step / mode step``)."""
    naive, coloc = runs["naive"].result.step_time, runs["colocated"].result.step_time
    rows = []
    for m in modes:
        r = runs[m]
        res: RunResult = r.result
        rows.append({
            "mode": m, "step_time_s": res.step_time,
            "speedup_vs_naive": naive / res.step_time, "speedup_vs_colocated": coloc / res.step_time,
            "gen_idle": res.gen_idle, "trainer_idle": res.trainer_idle, "stale_fraction": res.stale_fraction,
            "tag_fragments_per_step": res.tag_fragments_per_step,
            "gen_gpus": r.n_gen, "trainer_gpus": r.n_train, "fragment_size": r.plan.fragment_size,
            "chunk": [r.plan.chunk_generations, r.plan.chunk_timesteps] if Mode(m).tsp else None,
            "note": r.note, "tag_copy": bool(r.tag_copy), "publish": r.publish, "shard_groups": r.shard_groups,
            "stale_hold": r.plan.stale_hold, "gang_groups": r.plan.gang_groups,
            "sequence_parallel": r.plan.sequence_parallel,
            "generator_sequence_parallel": r.plan.generator_sequence_parallel,
            "label": r.candidate.label(r.plan),
            "planned_step_s": r.search.best.step_time if r.search is not None else None,
        })
        if baselines is not None:
            rows[-1]["baselines"] = {b["name"]: {**b, "speedup": (b["step_time_s"] / res.step_time
                                                                  if "step_time_s" in b else None)}
                                     for b in baselines}
    return rows


def print_table(rows: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for col in ("mode", "split g+t", "step time (s)", "vs naive", "vs colocated", "gen idle", "trainer idle",
                "TAG frags/step", "stale", "plan"):
        t.add_column(col, justify="left" if col in ("mode", "plan") else "right", no_wrap=col == "plan")
    for r in rows:
        split = (f"{r['gen_gpus']}+{r['trainer_gpus']}" if r["mode"] != "colocated"
                 else f"{r['trainer_gpus']} coloc" + (f" ({r['note']})" if r["note"] else ""))
        t.add_row(r["mode"], split, f"{r['step_time_s']:.1f}", f"{r['speedup_vs_naive']:.2f}x",
                  f"{r['speedup_vs_colocated']:.2f}x", f"{r['gen_idle']:.0%}", f"{r['trainer_idle']:.0%}",
                  f"{r['tag_fragments_per_step']:.1f}", f"{r['stale_fraction']:.0%}", plan_words(r))
    Console(width=max(170, Console().width)).print(t)


def print_baselines(rows: list[dict]) -> None:
    """The peer baselines under the table: label, training, step time, each mode's speedup over it."""
    for name, b in rows[0]["baselines"].items():
        if b.get("error"):
            print(f"baseline {name}: {b['label']}: does not fit ({b['error']})")
            continue
        ups = ", ".join(f"{r['mode']} {r['baselines'][name]['speedup']:.2f}x" for r in rows)
        same = "" if b["same_training"] else f" (trains {b['training']}, not as the modes above)"
        print(f"baseline {name}: {b['label']}{same}: {b['step_time_s']:.1f} s per step; {ups}")


def plan_words(row: dict) -> str:
    """The chosen plan's runtime settings beyond the split, in a few words: fragment size, chunk shape, publish
    path (``runtime.publish``), shard groups (``train.shard_groups``), TAG inference copy, stale hold, the
    sequence-parallel degrees of the trainer lanes and of the generators."""
    words = [f"frag {row['fragment_size']}", row.get("chunk") and "chunk {}x{}".format(*row["chunk"]),
             row.get("publish"), row.get("shard_groups", 1) > 1 and f"k={row['shard_groups']}",
             row.get("tag_copy") and "tag copy", row.get("stale_hold") and f"hold {row['stale_hold']:g}",
             row.get("sequence_parallel", 1) > 1 and f"sp {row['sequence_parallel']}",
             row.get("generator_sequence_parallel", 1) > 1 and f"gen sp {row['generator_sequence_parallel']}"]
    return ", ".join(w for w in words if w)


def main(argv: list[str] | None = None) -> int:
    args = parse_with_overrides(build_parser(), argv)  # KEY=VALUE positionals as --set
    record_mode = (args.trace_mode or args.modes[-1]) if (args.trace or args.gantt) else None
    if args.config is not None:
        return _main_config(args, record_mode)
    try:
        if args.model is None or args.testbed is None:
            raise CliError("--model and --testbed are required (or --config with --profile)")
        setup = _setup(args)
        bts = bts_of(args)
        runs = run_modes(setup, args.modes, args.gen_gpus, args.jitter, args.seed, record_mode, bts)
        base = None if args.no_baselines or setup.profile is not None else run_baselines(setup, bts)
    except (AlgorithmError, CliError, PresetError, ScenarioError, ProfileError) as e:
        print(f"digenrl simulate: error: {e}", file=sys.stderr)
        return 2
    w = setup.workload
    rows = rows_of(runs, args.modes, base)
    _emit(rows, args, f"{setup.model.name} on testbed {setup.testbed.name} ({setup.gpus} GPUs): "
                      f"{w.prompts}x{w.generations} per step, T={w.sampling_steps}, S={w.trained_timesteps}, "
                      f"{training_words(w.training)}, exposed communication {setup.assume.exposed_comm:g}, "
                      f"{setup.steps} steps")
    if base is not None and not args.json:
        print_baselines(rows)
    if record_mode is not None:
        run = runs[record_mode]
        _write_views(run.result, args, f"{setup.model.name}, {run.mode.value}, testbed {setup.testbed.name}, "
                                       f"{run.n_gen}+{run.n_train} GPUs")
    return 0


def _emit(rows: list[dict], args, title: str) -> None:
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print_table(rows, title)


def _main_config(args, record_mode: str | None) -> int:
    """``--config``: the run's own plan per mode, priced with the measured ``--profile`` or on ``--testbed``."""
    from ..config import ConfigError
    from .config_source import run_config_modes
    from .from_config import ConfigSimError

    try:
        if args.model:
            raise CliError("--config: give either --config or --model/--testbed, not both")
        if (args.algorithm, args.window, args.flash_ratio, args.nft_timesteps, args.nft_old_policy) != (
                "flow_grpo", 4, 1.0, None, "soft"):
            raise CliError("--algorithm: with --config the algorithm is the config's (--set train.algorithm=...)")
        # the TAG flags override the config's runtime.tag_policy / tuning.bts (the runtime's own keys)
        args.sets = list(args.sets) + ([f"runtime.tag_policy={args.tag_policy}"] if args.tag_policy != "auto" else [])
        args.sets += [f"tuning.bts.depth={args.bts_depth}"] if args.bts_depth is not None else []
        args.sets += [f"tuning.bts.budget_nodes={args.bts_budget_nodes}"] if args.bts_budget_nodes is not None else []
        kw, source = cost_source(args)
        _check_modes(args)
        if args.profile is not None and args.gpus is not None:
            raise CliError("--gpus: with --profile the pools are the config's (use --set runtime.generators=...)")
        config = None if args.config == "default" else args.config
        sets = args.sets if args.profile is not None else args.sets + [f"steps={at_least(args, 'steps', 1)}"]
        runs = run_config_modes(config, sets, args.modes, gpus=args.gpus, jitter=args.jitter, seed=args.seed,
                                record_mode=record_mode, search_plan=args.search, **kw)
        title = f"{args.config} " + (f"with {source}" if args.profile else f"on {source}, {args.steps} steps")
        if args.search:
            title += ", each mode planned by the planner (as digenrl plan)"
    except (CliError, ConfigError, ConfigSimError, PresetError, ProfileError) as e:
        print(f"digenrl simulate: error: {e}", file=sys.stderr)
        return 2
    _emit(rows_of(runs, args.modes), args, title)
    if record_mode is not None:
        _write_views(runs[record_mode].result, args, f"{args.config}, {record_mode} ({title})")
    return 0


def _write_views(res: RunResult, args, title: str) -> None:
    """--trace (whole run) and --gantt (first --gantt-steps steps) of one simulated mode."""
    if args.trace:
        res.write_trace(args.trace)
    if args.gantt:
        res.write_gantt(args.gantt, title, steps=args.gantt_steps)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
