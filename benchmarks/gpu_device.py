"""The bare-device GPU check (issue 36, item 6): the operations the cost model prices, measured on one GPU at real
model widths with few blocks; writes a raw results file and a profile the simulator reads (``sim.device_profile``).
DigenRL's own step on the device, measured against the simulator, is ``gpu_step.py``'s.

    python benchmarks/gpu_device.py --out DIR            # on a GPU (about 5 minutes on one H200)
    python benchmarks/gpu_device.py --tiny --out DIR     # anywhere (CPU): tiny widths, seconds

It needs torch, diffusers, peft, pydantic (DigenRL's config) and DigenRL itself, no Ray and no network
(``benchmarks/gpu_acceptance.sh --device`` installs the wheel bundle of ``scripts/device_bundle.sh`` first).
Stages, each timed and recorded on its own (a failing stage records its error and the others still run):

* ``forward``: one transformer forward against batch (1, 2, 4) at FLUX.1-dev, Qwen-Image and Wan2.1-14B widths
  (the registry's configs, ``models.specs``) with 1 and 2 block units (FLUX: 1 double + 2 single blocks per unit; Qwen-Image and
  Wan: 1 block), bf16, 512 px images / 33 x 480 x 832 video latents;
* ``train``: forward + backward against cells per chunk (1, 3, 8) with activation recomputation (diffusers'
  gradient checkpointing), full fine-tuning, bf16 weights;
* ``compile``: a batch-1 forward eager against ``torch.compile`` (FLUX width; the compile time apart);
* ``lora``: a batch-1 forward with rank-64 LoRA adapters (peft) unmerged against merged into the weights;
* ``vae``: the FLUX VAE decode against batch (1, 4) at 512 px;
* ``host_copy``: host <-> device copies, pinned against pageable memory (GB/s);
Each time is the median of ``--repeats`` synchronised calls after one warm-up. ``--tiny`` shrinks every width,
resolution and step count so the whole script runs on a CPU in the test suite; its numbers say nothing about
a GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

FAMILIES = ("flux", "qwen-image", "wan")
BATCHES = (1, 2, 4)
CELLS = (1, 3, 8)
UNITS = (1, 2)


def _configs(tiny: bool) -> dict:
    """diffusers constructor kwargs per family, the real widths (``models.specs``) or tiny ones; and the inputs'
    token counts."""
    from digenrl.models.specs import SPECS

    FLUX_CONFIG, QWEN_CONFIG, WAN_CONFIG = (SPECS[k].config for k in ("flux", "qwen_image", "wan"))

    if tiny:
        return {
            "flux": (dict(FLUX_CONFIG, attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                          pooled_projection_dim=16, in_channels=16, axes_dims_rope=(4, 6, 6)), 64, 8),
            "qwen-image": (dict(QWEN_CONFIG, attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                in_channels=16, out_channels=4, axes_dims_rope=(4, 6, 6)), 64, 8),
            "wan": (dict(WAN_CONFIG, attention_head_dim=16, num_attention_heads=2, ffn_dim=64, text_dim=32,
                         freq_dim=32, in_channels=4, out_channels=4), (2, 8, 8), 8),
        }
    return {"flux": (dict(FLUX_CONFIG), 1024, 512), "qwen-image": (dict(QWEN_CONFIG), 1024, 256),
            "wan": (dict(WAN_CONFIG), (9, 60, 104), 512)}


def build(family: str, units: int, tiny: bool, device, dtype):
    """A random-weight diffusers transformer of ``family`` with ``units`` block units, and a batch-b input maker."""
    import torch

    cfg, tokens, n_txt = _configs(tiny)[family]
    with torch.device(device):
        if family == "flux":
            from diffusers import FluxTransformer2DModel

            kw = {k: v for k, v in cfg.items()}
            kw.update(num_layers=units, num_single_layers=2 * units)
            model = FluxTransformer2DModel(**kw)
        elif family == "qwen-image":
            from diffusers import QwenImageTransformer2DModel

            model = QwenImageTransformer2DModel(**dict(cfg, num_layers=units))
        else:
            from diffusers import WanTransformer3DModel

            model = WanTransformer3DModel(**dict(cfg, num_layers=units))
    model = model.to(dtype)

    def inputs(b: int) -> dict:
        g = torch.Generator(device="cpu").manual_seed(b)

        def rnd(*shape):
            return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)
        t = torch.full((b,), 0.5, device=device, dtype=dtype)
        if family == "flux":
            side = int(tokens ** 0.5)
            r, c = torch.arange(side).repeat_interleave(side), torch.arange(side).repeat(side)
            img_ids = torch.stack([torch.zeros_like(r), r, c], 1).float().to(device)  # (0, row, column)
            return dict(hidden_states=rnd(b, tokens, cfg["in_channels"]),
                        encoder_hidden_states=rnd(b, n_txt, cfg["joint_attention_dim"]),
                        pooled_projections=rnd(b, cfg["pooled_projection_dim"]), timestep=t,
                        guidance=torch.full((b,), 3.5, device=device, dtype=dtype),
                        img_ids=img_ids, txt_ids=torch.zeros(n_txt, 3, device=device), return_dict=False)
        if family == "qwen-image":
            side = int(tokens ** 0.5)
            return dict(hidden_states=rnd(b, tokens, cfg["in_channels"]),
                        encoder_hidden_states=rnd(b, n_txt, cfg["joint_attention_dim"]),
                        encoder_hidden_states_mask=torch.ones(b, n_txt, device=device, dtype=torch.long),
                        timestep=t, img_shapes=[[(1, side, side)]] * b,
                        return_dict=False)
        f, h, w = tokens
        return dict(hidden_states=rnd(b, cfg["in_channels"], f, h, w), timestep=t * 1000,
                    encoder_hidden_states=rnd(b, n_txt, cfg["text_dim"]), return_dict=False)
    return model, inputs


def _time(fn, device, repeats: int) -> float:
    from flux_random import median_time

    return median_time(fn, device, repeats)


def _free(device) -> None:
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def stage_forward(a, device, dtype) -> dict:
    import torch

    out: dict = {}
    for fam in a.families:
        out[fam] = {}
        for u in UNITS:
            model, inp = build(fam, u, a.tiny, device, dtype)
            model.eval()
            pts = []
            for b in BATCHES:
                x = inp(b)
                with torch.no_grad():
                    pts.append([b, _time(lambda: model(**x), device, a.repeats)])
            out[fam][str(u)] = pts
            model = None  # (frees it; a rebinding, not a del, as the timed closures above refer to it)
            _free(device)
    return out


def stage_train(a, device, dtype) -> dict:
    out: dict = {}
    for fam in a.families:
        out[fam] = {}
        for u in UNITS:
            model, inp = build(fam, u, a.tiny, device, dtype)
            model.train()
            if hasattr(model, "enable_gradient_checkpointing"):
                model.enable_gradient_checkpointing()
            pts = []
            for c in CELLS:
                x = inp(c)

                def step():
                    y = model(**x)[0]
                    y.float().square().mean().backward()
                try:
                    pts.append([c, _time(step, device, a.repeats)])
                except RuntimeError as e:  # out of memory at this chunk: recorded, the smaller ones kept
                    pts.append([c, None, str(e).splitlines()[0]])
                    _free(device)
                model.zero_grad(set_to_none=True)
            out[fam][str(u)] = pts
            model = None  # (frees it; a rebinding, not a del, as the timed closures above refer to it)
            _free(device)
    return out


def stage_compile(a, device, dtype) -> dict:
    import torch

    model, inp = build("flux", 1, a.tiny, device, dtype)
    model.eval()
    x = inp(1)
    with torch.no_grad():
        eager = _time(lambda: model(**x), device, a.repeats)
        compiled = torch.compile(model)
        t0 = time.perf_counter()
        compiled(**x)
        first = time.perf_counter() - t0
        comp = _time(lambda: compiled(**x), device, a.repeats)
    return {"family": "flux", "units": 1, "eager_s": eager, "compiled_s": comp, "speedup": eager / comp,
            "compile_s": first}


def stage_lora(a, device, dtype) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model

    model, inp = build("flux", 1, a.tiny, device, dtype)
    model.eval()
    x = inp(1)
    rank = 4 if a.tiny else 64
    peft = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, init_lora_weights="gaussian",
                                            target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
    with torch.no_grad():
        unmerged = _time(lambda: peft(**x), device, a.repeats)
        merged_model = peft.merge_and_unload()
        merged = _time(lambda: merged_model(**x), device, a.repeats)
    return {"family": "flux", "units": 1, "rank": rank, "unmerged_s": unmerged, "merged_s": merged,
            "unmerged_over_merged": unmerged / merged}


def stage_vae(a, device, dtype) -> dict:
    import torch
    from flux_random import flux_vae

    vae = flux_vae(tiny=a.tiny, device=device).to(dtype).eval()
    side = 8 if a.tiny else 64  # latent side: 512 px / 8
    ch = vae.config.latent_channels
    pts = []
    for b in (1, 4):
        z = torch.randn(b, ch, side, side, device=device, dtype=dtype)
        with torch.no_grad():
            pts.append([b, _time(lambda: vae.decode(z, return_dict=False), device, a.repeats)])
    return {"px": side * 8, "points": pts}


def stage_host_copy(a, device, dtype) -> dict:
    import torch

    n = (4 if a.tiny else 512) * 2 ** 20
    out = {"bytes": n}
    for pinned in (False, True):
        host = torch.empty(n, dtype=torch.uint8, pin_memory=pinned and device.type == "cuda")
        dev = torch.empty(n, dtype=torch.uint8, device=device)
        h2d = _time(lambda: dev.copy_(host, non_blocking=pinned), device, a.repeats)
        d2h = _time(lambda: host.copy_(dev, non_blocking=pinned), device, a.repeats)
        key = "pinned" if pinned else "pageable"
        out[key] = {"h2d_gbs": n / h2d / 1e9, "d2h_gbs": n / d2h / 1e9}
    return out


STAGES = {"forward": stage_forward, "train": stage_train, "compile": stage_compile, "lora": stage_lora,
          "vae": stage_vae, "host_copy": stage_host_copy}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for device.json and profile_device.json")
    ap.add_argument("--tiny", action="store_true", help="tiny widths on the CPU (a dry run)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--families", default=",".join(FAMILIES), help="model widths of forward / train")
    a = ap.parse_args(argv)
    a.families = [f for f in a.families.split(",") if f]
    bad = [f for f in a.families if f not in FAMILIES] + [s for s in a.stages.split(",") if s not in STAGES]
    if bad:
        print(f"gpu_device: error: unknown --families / --stages value(s): {', '.join(bad)}", file=sys.stderr)
        return 2
    import torch

    from digenrl.control.profile import save_profile
    from digenrl.sim.device_profile import profile_from_device

    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device("cpu" if a.tiny or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    meta = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__, "tiny": a.tiny, "dtype": str(dtype).split(".")[-1],
            "date": time.strftime("%Y-%m-%d"), "units": list(UNITS), "batches": list(BATCHES), "cells": list(CELLS)}
    raw: dict = {"format": "digenrl-device-results", "meta": meta, "stages": {}}
    path = out_dir / "device.json"
    for name in a.stages.split(","):
        t0 = time.perf_counter()
        try:
            res = STAGES[name](a, device, dtype)
            raw["stages"][name] = {"ok": True, "seconds": time.perf_counter() - t0, "result": res}
        except Exception as e:  # noqa: BLE001 - recorded, the other stages still run
            raw["stages"][name] = {"ok": False, "seconds": time.perf_counter() - t0,
                                   "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
        print(f"{name}: {'ok' if raw['stages'][name]['ok'] else raw['stages'][name]['error']} "
              f"[{raw['stages'][name]['seconds']:.1f}s]", flush=True)
        path.write_text(json.dumps(raw, indent=1))
    for fam in a.families:  # one profile per family measured (FLUX's is profile_device.json)
        name = "profile_device.json" if fam == "flux" else f"profile_device_{fam}.json"
        try:
            save_profile(profile_from_device(raw, fam), out_dir / name)
        except (KeyError, ValueError) as e:
            print(f"profile {fam}: not written ({e})", flush=True)
    return 0 if all(s["ok"] for s in raw["stages"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
