"""GPU calibration: a measured ``digenrl-profile`` of FLUX.1 at the real widths, scaled to the real block count.

Run it once on a GPU and commit the two files it writes (``benchmarks/results/gpu_calibrate_<gpu>.json``, the raw
measurements, and ``benchmarks/results/profile_flux1_<gpu>.json``, the profile)::

    python benchmarks/gpu_calibrate.py                        # configs/flux1_dev.yaml: LoRA r64, bf16, T=6, 512 px
    digenrl simulate --config configs/flux1_dev.yaml --profile benchmarks/results/profile_flux1_<gpu>.json
    digenrl plan --config configs/flux1_dev.yaml --profile benchmarks/results/profile_flux1_<gpu>.json --out plan.yaml

It has not been run on a GPU yet (the session that wrote it had none); only ``--tiny`` has run, on a CPU.
The raw file is rewritten after each model measured (``complete: false`` until the end), so a run cut short
keeps what it measured; stderr shows the elapsed time per model.

What runs is the code of the workers, on a ``FluxPolicy`` with random weights (``flux_random``, nothing
downloaded) configured from ``--config`` (+ ``--set key=value``): sampler settings, timestep plan, LoRA or full
fine-tuning, model dtype, ``train.mixed_precision`` (``train.precision.prepare_policy``), the optimizer
(``train.context.make_optimizer``), the loss settings. Each time is the median of ``--repeats`` calls after one
warm-up, synchronised on the device. The ops of ``schedule.cost`` measured:

* ``denoise`` (batch = generations): ``sample_trajectories`` of n generations (SDE steps with log-probs,
  guidance as the policy applies it: FLUX.1-dev's guidance embedding, one forward per step), divided by the
  sampling steps T; ``generator/denoise`` on the policy as a generator builds it, ``trainer/denoise`` (TAG and
  colocated generation) on the trainer's policy, prepared for training (fp32 masters, autocast);
* ``vae_decode`` (generations): ``policy.decode`` of the final latents (``model.options.vae_batch``);
* ``transfer`` (generations): pickle round trip of the trajectory batch (what ``runtime.timing`` times);
* ``train_chunk`` (cells): ``train_cells`` forward + backward of c cells (timestep-major grid, as the TSP
  tiling; with the reference forward when ``train.beta_kl`` > 0), with activation recomputation off and on
  (``train.activation_checkpointing``), into existing grads;
* ``optimizer``: gradient clipping + AdamW step + zeroing the grads (``GradientTransaction.commit``'s work) +
  the EMA update (``train.ema_decay``; timed as a commit that updates it, as ``runtime.timing`` does);
* ``publish``: ``train.sharding.full_trainable_state`` (trainable state to host) + pickle round trip + load into the
  policy (the object-store publish that ``runtime.timing`` times), for the LoRA or the full trainable state.

``--finetune lora full`` measures both; the profile is written for the config's ``model.lora.enabled`` and
``train.activation_checkpointing``. Not measured, written as 0 and named in the profile's ``source``:
``reward`` (task-specific: add the reward model's time), ``allreduce`` (one trainer; the profile says
``trainers: 1``), ``tag_switch`` (no inference copy to build without FSDP, as ``runtime.calibrate``).

Scaling to the real block count. FLUX.1 has 19 double-stream + 38 single-stream blocks. The script builds
L double + 2L single blocks (the same 1:2 ratio: a "unit" is 1 double + 2 single blocks, FLUX.1 is L* = 19
units) at each of ``--layers`` (default 1 and 3). For every point (op, batch) it fits by least squares::

    t(L) = a + b * L        and reports        t(L*) = a + b * L*      (clamped at >= 0)

(with two counts L1 < L2: t(L*) = t(L1) + (t(L2) - t(L1)) * (L* - L1) / (L2 - L1)). Why affine: blocks of
one kind are identical (same shapes, same kernels, same bytes), so each unit adds the same work b, and what
does not depend on L (embedders, final norm and projection, rotary tables, the SDE step and log-prob, the
loss, kernel-launch and Python overhead, the host side of a publish) is the intercept a. A proportional rule
t(L1) * L* / L1 multiplies that fixed part by 19 as well, which overprices exactly the ops where it is large
(a LoRA publish, small batches). The premise, work exactly affine in L, is checked in the tests on FLOPs
(``torch.utils.flop_counter``); noise in t(L2) - t(L1) is amplified by (L* - L1) / (L2 - L1), hence L2 = 3 by
default; ``--check-layers N`` also measures N units directly and records the rule's error on time.
``vae_decode`` and ``transfer`` do not depend on L: measured at the first layer count, unscaled. The raw results
also give the trainable parameters and publish bytes at L* per variant (``at_target``; exact, sizes are affine)
for pricing what one GPU cannot measure (the gradient all-reduce of several trainers).

``--tiny`` shrinks everything (64-wide FLUX, tiny VAE, 64 px = 256 latent tokens, 8 text tokens, T=3, LoRA r4,
fp32, CPU, scaled to 4 units) so that it runs in seconds on a CPU inside the test suite; its numbers say
nothing about a GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import pickle
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling module flux_random
from flux_random import flux_policy, median_time  # noqa: E402

FLUX1_UNITS = 19  # FLUX.1-dev transformer/config.json: num_layers 19, num_single_layers 38 = 2 x 19
TINY_SETS = ["model.dtype=float32", "model.device=cpu", "train.mixed_precision=none", "model.lora.rank=4",
             "model.lora.alpha=8", "model.options.height=64", "model.options.width=64", "sampler.num_steps=3",
             "model.options.max_sequence_length=8"]  # fmt: skip
SCALED_OPS = ("denoise", "denoise_trainer", "train_chunk", "optimizer", "publish")


def fit_affine(layers: list[int], seconds: list[float]) -> tuple[float, float]:
    """Least-squares (a, b) of t = a + b * L (exact through the points for two layer counts)."""
    if len(set(layers)) < 2:
        raise ValueError(f"--layers: need at least two different layer counts to fit a + b*L (got {layers})")
    n = len(layers)
    mx, my = sum(layers) / n, sum(seconds) / n
    b = sum((x - mx) * (y - my) for x, y in zip(layers, seconds)) / sum((x - mx) ** 2 for x in layers)
    return my - b * mx, b


def scale_to(layers: list[int], seconds: list[float], target: int) -> float:
    a, b = fit_affine(layers, seconds)
    return max(0.0, a + b * target)


def scaled_points(per_layer: dict[str, list], target: int) -> list[list]:
    """per_layer: {"L": [[batch, seconds or None], ...]} -> [[batch, t(target)]] over batches measured (not OOM)
    at every layer count."""
    layers = sorted(per_layer, key=int)
    batches = sorted({b for pts in per_layer.values() for b, _ in pts})
    out = []
    for b in batches:
        ts = [dict((int(x), s) for x, s in per_layer[L]).get(b) for L in layers]
        if all(t is not None for t in ts):
            out.append([b, scale_to([int(L) for L in layers], ts, target)])
    return out


def profile_from(raw: dict, lora: bool, recompute: bool) -> dict:
    """The ``digenrl-profile`` dict (``control.profile``) of one variant of the raw measurements."""
    variant = "lora" if lora else "full"
    if variant not in raw["variants"]:
        raise KeyError(f"the results have no {variant!r} measurements (measured: {', '.join(raw['variants'])})")
    per_l = raw["variants"][variant]["layers"]
    target, rec = raw["meta"]["target_units"], "recompute" if recompute else "no_recompute"

    def op(name, key=None):
        return scaled_points({L: m[name] if key is None else m[name][key] for L, m in per_l.items()}, target)

    un = raw["unscaled"]
    ops = {"generator/denoise": op("denoise"), "trainer/denoise": op("denoise_trainer"),
           "vae_decode": un["vae_decode"], "reward": [[1, 0.0]], "transfer": un["transfer"],
           "train_chunk": op("train_chunk", rec), "allreduce": [[1, 0.0]], "optimizer": op("optimizer"),
           "publish": op("publish"), "tag_switch": [[1, 0.0]]}
    if not ops["train_chunk"]:
        raise ValueError(f"train_chunk ({rec}): no chunk size was measured at every layer count (out of memory?)")
    m = raw["meta"]
    widths = "tiny 64-wide FLUX (--tiny)" if m["tiny"] else "FLUX.1 widths"
    source = (f"benchmarks/gpu_calibrate.py on {m['device']}, {m['date']}: {widths}, {variant}"
              f"{' r' + str(m['lora_rank']) if lora else ''}, {m['dtype']} weights, mixed precision "
              f"{m['mixed_precision']}, recomputation {'on' if recompute else 'off'}, {m['resolution']} px, "
              f"{m['text_tokens']} text tokens, T={m['sampling_steps']}; measured at "
              f"{'/'.join(str(L) for L in m['layers'])} units (1 double + 2 single blocks each); denoise "
              f"(generator: as built; trainer: prepared for training), train_chunk, optimizer, publish scaled to "
              f"{target} units by t = a + b*L fitted per batch; vae_decode, transfer unscaled; reward, allreduce, "
              f"tag_switch not measured (0); one device, no actor-call overhead")
    return {"format": "digenrl-profile", "version": 1, "source": source, "generators": 1, "trainers": 1, "ops": ops}


def _oom_types() -> tuple:
    return tuple(t for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None))
                 if t is not None)


def _timed_or_oom(fn, device, repeats):
    try:
        return median_time(fn, device, repeats)
    except _oom_types():  # the point is left out of the profile (recorded as null)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return None


def measure(cfg, args, device, units: int, lora: bool, unscaled: dict | None) -> dict:
    """Every op at ``units`` units for one fine-tuning variant; fills ``unscaled`` (decode, transfer) if given."""
    from digenrl.control.run_plan import timestep_plan
    from digenrl.rollout.records import Prompt
    from digenrl.rollout.sampler import sample_trajectories
    from digenrl.train.sharding import full_trainable_state
    from digenrl.train.chunk_loss import train_cells
    from digenrl.train.context import loss_settings, make_optimizer, make_reference, sampler_settings
    from digenrl.train.ema import ParamEMA
    from digenrl.train.precision import prepare_policy

    m = cfg.model
    mcfg = m.model_copy(update={"device": str(device), "lora": m.lora.model_copy(update={"enabled": lora}),
                                "options": {**m.options, "reference_copy": False}})
    prompt = Prompt(uid=0, text="calibration prompt")
    policy = flux_policy(mcfg, double=units, single=2 * units, tiny=args.tiny, prompts=[prompt.text])
    settings, plan = sampler_settings(cfg), timestep_plan(cfg, 0)

    def sample(n):
        return sample_trajectories(policy, [prompt] * n, list(range(n)), step=0, run_seed=cfg.seed, version=0,
                                   settings=settings, plan=plan, decode=False)

    def denoise(n):
        s = _timed_or_oom(lambda: sample(n), device, args.repeats)
        return [n, None if s is None else s / settings.num_steps]

    out = {"denoise": []}
    for n in args.gen_sizes:
        out["denoise"].append(denoise(n))
        if unscaled is not None:
            tb = sample(n)
            unscaled["vae_decode"].append([n, median_time(lambda: policy.decode(tb.final), device, args.repeats)])
            unscaled["transfer"].append([n, median_time(lambda: pickle.loads(pickle.dumps(tb, protocol=5)), device,
                                                        args.repeats)])
    S = len(plan.trained)
    G = max(2, -(-max(args.cells) // S))
    group = sample(G)
    group.advantages = torch.tensor([1.0 if g % 2 == 0 else -1.0 for g in range(G)])  # nonzero: no cell filtered
    grid = [(g, j) for j in range(S) for g in range(G)]  # timestep-major, like the TSP tiling
    loss = loss_settings(cfg)
    ref = make_reference(policy) if cfg.train.beta_kl > 0 else None  # the KL term's reference forward
    def chunk(c):
        return train_cells(policy, group, grid[:c], settings=loss, loss_scale=1e-9, ref_policy=ref)

    out["train_chunk"] = {}
    for rec in (False, True):
        prepare_policy(policy, cfg.model_copy(update={"train": cfg.train.model_copy(
            update={"activation_checkpointing": rec})}))  # fmt: skip
        out["train_chunk"]["recompute" if rec else "no_recompute"] = [
            [c, _timed_or_oom(lambda: chunk(c), device, args.repeats)] for c in args.cells]
    prepare_policy(policy, cfg)  # the trainer's own generation (TAG, colocated) with the config's settings
    out["denoise_trainer"] = [denoise(n) for n in args.gen_sizes]
    params = [p for p in policy.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    opt, max_norm, t = make_optimizer(policy, cfg), cfg.train.max_grad_norm, cfg.train
    # every=1: each timed commit is one that updates the EMA (with ema_every = k, 1 in k commits does)
    ema = ParamEMA(policy, t.ema_decay, every=1, warmup=t.ema_warmup) if t.ema_decay is not None else None

    def commit():
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, max_norm)
        opt.step()
        opt.zero_grad(set_to_none=False)
        if ema is not None:
            ema.update()

    def publish():
        policy.load_trainable_state_dict(pickle.loads(pickle.dumps(full_trainable_state(policy), protocol=5)))

    out["optimizer"] = [[1, median_time(commit, device, args.repeats)]]
    out["publish"] = [[1, median_time(publish, device, args.repeats)]]
    out["trainable_params"] = sum(p.numel() for p in params)
    out["publish_bytes"] = sum(p.numel() * p.element_size() for p in params)
    out["transformer_params"] = sum(p.numel() for p in policy.transformer.parameters())
    del policy, opt, params, group, ref, ema
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def check_rule(raw: dict, check: dict) -> dict:
    """Per point: predicted / measured - 1, the fit at --layers against the direct measurement at N units."""
    out = {}
    for variant, at_n in check.items():
        per_l = raw["variants"][variant]["layers"]
        for name in SCALED_OPS:
            keys = [None] if name != "train_chunk" else ["no_recompute", "recompute"]
            for key in keys:
                pick = (lambda d: d[name]) if key is None else (lambda d: d[name][key])
                fit = scaled_points({L: pick(d) for L, d in per_l.items()}, raw["meta"]["check_units"])
                pred = dict(map(tuple, fit))
                for b, s in pick(at_n):
                    if s and b in pred:
                        out[f"{variant}/{name}{'/' + key if key else ''}/{b}"] = pred[b] / s - 1
    return out


def run(args, cfg, save=lambda raw: None) -> dict:
    """All measurements; ``save(raw)`` after each model (a run cut short keeps what it measured, ``complete``
    false)."""
    t_start = time.perf_counter()
    dev_name = cfg.model.device if args.device == "auto" else args.device
    if dev_name.startswith("cuda") and not torch.cuda.is_available():
        dev_name = "cpu"
    device = torch.device(dev_name)
    if device.type == "cpu":
        torch.set_num_threads(1)  # a CPU run is a smoke test; several threads on a shared machine only add noise
    raw = {"meta": {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "tiny": args.tiny,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "config": str(args.config), "sets": args.sets,
        "layers": args.layers, "target_units": args.target_units, "check_units": args.check_layers,
        "dtype": cfg.model.dtype, "mixed_precision": cfg.train.mixed_precision, "lora_rank": cfg.model.lora.rank,
        "resolution": cfg.model.options.get("height"), "text_tokens": cfg.model.options.get("max_sequence_length"),
        "sampling_steps": cfg.sampler.num_steps, "gen_sizes": args.gen_sizes, "cells": args.cells,
        "repeats": args.repeats, "torch": torch.__version__, "scaling": "t(L) = a + b*L least squares per point"},
        "unscaled": {"vae_decode": [], "transfer": []}, "variants": {}, "complete": False}  # fmt: skip
    check = {}
    for i, variant in enumerate(args.finetune):
        layers = {}
        for j, units in enumerate(args.layers):
            unscaled = raw["unscaled"] if (i == 0 and j == 0) else None
            layers[str(units)] = measure(cfg, args, device, units, variant == "lora", unscaled)
            raw["variants"][variant] = {"layers": layers}
            save(raw)
            print(f"[{time.perf_counter() - t_start:.0f} s] {variant} {units} units: {json.dumps(layers[str(units)])}",
                  file=sys.stderr, flush=True)
        units_ = [int(u) for u in layers]
        at_target = {k: round(scale_to(units_, [layers[str(u)][k] for u in units_], args.target_units))
                     for k in ("trainable_params", "publish_bytes", "transformer_params")}  # exact: sizes are affine
        raw["variants"][variant] = {"layers": layers, "at_target": at_target}
        if args.check_layers:
            check[variant] = measure(cfg, args, device, args.check_layers, variant == "lora", None)
            raw["check"] = {"measured": check}
            save(raw)
    if check:
        raw["check"] = {"measured": check, "relative_error": check_rule(raw, check)}
    if device.type == "cuda":
        raw["meta"]["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    raw["profile_variant"] = {"lora": cfg.model.lora.enabled, "recompute": cfg.train.activation_checkpointing}
    raw["meta"]["seconds"] = time.perf_counter() - t_start
    raw["complete"] = True
    return raw


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(Path(__file__).resolve().parents[1] / "configs" / "flux1_dev.yaml"))
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--tiny", action="store_true", help="64-wide FLUX on CPU in seconds (smoke test)")
    ap.add_argument("--layers", type=int, nargs="+", default=None, help="units measured (default 1 3; tiny 1 2)")
    ap.add_argument("--target-units", type=int, default=None, help=f"units scaled to (default {FLUX1_UNITS}; tiny 4)")
    ap.add_argument("--check-layers", type=int, default=None, help="also measure this many units directly")
    ap.add_argument("--finetune", nargs="+", default=["lora", "full"], choices=["lora", "full"])
    ap.add_argument("--gen-sizes", type=int, nargs="+", default=None, help="generations (default 1 2 4 8 16)")
    ap.add_argument("--cells", type=int, nargs="+", default=None, help="chunk cells (default 1 2 4 8 16)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="auto", help="auto: the config's model.device (cpu if no GPU)")
    ap.add_argument("--out", type=Path, default=None, help="raw results JSON")
    ap.add_argument("--profile", type=Path, default=None, help="digenrl-profile JSON")
    args = ap.parse_args(argv)
    small = args.tiny
    args.layers = args.layers or ([1, 2] if small else [1, 3])
    args.target_units = args.target_units or (4 if small else FLUX1_UNITS)
    args.gen_sizes = sorted(set(args.gen_sizes or ([1, 4] if small else [1, 2, 4, 8, 16])))
    args.cells = sorted(set(args.cells or ([1, 4] if small else [1, 2, 4, 8, 16])))
    return args


def _check(args):
    """(config, errors): every input problem named before anything runs or is written."""
    from digenrl.config import ConfigError, load_config

    bad = [f"{k}: {v} (must be >= 1)" for k, v in (("--layers", args.layers), ("--gen-sizes", args.gen_sizes),
                                                  ("--cells", args.cells), ("--target-units", [args.target_units]),
                                                  ("--repeats", [args.repeats]),
                                                  ("--check-layers", [args.check_layers or 1])) if min(v) < 1]
    if len(set(args.layers)) < 2:
        bad.append(f"--layers: {args.layers} (need two different counts to fit t = a + b*L)")
    if args.tiny and (args.out is None or args.profile is None):
        bad.append("--out and --profile are required with --tiny (tiny numbers do not belong in benchmarks/results)")
    try:
        cfg = load_config(args.config, (TINY_SETS if args.tiny else []) + args.sets)
    except ConfigError as e:
        return None, bad + [f"--config/--set: {e}"]
    if cfg.model.kind != "flux":
        bad.append(f"--config: model.kind={cfg.model.kind!r}; this calibration builds FLUX.1 (model.kind=flux)")
    variant = "lora" if cfg.model.lora.enabled else "full"
    if variant not in args.finetune:
        bad.append(f"--finetune: {' '.join(args.finetune)} leaves out the config's {variant!r} (model.lora.enabled)")
    return cfg, bad


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg, bad = _check(args)
    if bad:
        print(f"gpu_calibrate: error: {'; '.join(bad)}", file=sys.stderr)
        return 2
    slug = "cpu" if not torch.cuda.is_available() else re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name().lower())
    results = Path(__file__).resolve().parent / "results"
    out = args.out or results / f"gpu_calibrate_{slug.strip('-')}.json"
    prof = args.profile or results / f"profile_flux1_{slug.strip('-')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    raw = run(args, cfg, save=lambda r: out.write_text(json.dumps(r, indent=1)))
    out.write_text(json.dumps(raw, indent=1))  # the raw measurements first: kept even if no profile can be made
    profile = profile_from(raw, **raw["profile_variant"])
    prof.parent.mkdir(parents=True, exist_ok=True)
    prof.write_text(json.dumps(profile, indent=1))
    print(json.dumps(profile, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
