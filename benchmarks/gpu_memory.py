"""Peak memory and step time of training FLUX-width blocks under each memory setting, next to the memory plan.

The transformer is ``FluxTransformer2DModel`` at the FLUX.1-dev widths (``models.specs``)
with ``--double`` double-stream and ``--single`` single-stream blocks; one training chunk of ``--cells``
samples with ``--tokens`` latent and ``--text`` text tokens runs forward + backward into existing gradients
(after one chunk and one AdamW step, the steady state of a chunked step), for every combination of

* LoRA (rank ``--rank``) or full fine-tuning,
* precision: fp32, or bf16 mixed precision (fp32 masters, autocast; LoRA: frozen base in bf16),
* activation recomputation off / on (diffusers gradient checkpointing).

Peak: ``torch.cuda.max_memory_allocated`` on a GPU; on CPU the allocation counter of ``models.memory_probe``
(bytes of live tensors); ``state_gib`` is what is live before the chunk (weights, grads, AdamW state) and
``act_gib`` = peak - state. ``plan_gib`` / ``plan_act_gib`` are ``train.memory.plan_memory`` for the same shape
(no VAE, no reserve), ``plan_err`` / ``plan_act_err`` = plan / measured - 1. ``--tiny`` uses a 64-wide FLUX (no plan) so the script runs on CPU in
seconds inside the test suite. Output: one JSON object (also written to ``--out``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling module flux_random
from flux_random import flux_transformer  # noqa: E402

GiB = 1024 ** 3


def _model(args, dtype, device):
    if args.tiny:
        torch.manual_seed(0)
        return flux_transformer(args.double, args.single, tiny=True, in_channels=64).to(device=device, dtype=dtype)
    from digenrl.models.memory_probe import build_transformer

    return build_transformer("flux", {"num_layers": args.double, "num_single_layers": args.single}, dtype=dtype,
                             device=device)


def _inputs(args, model, device, dtype):
    from digenrl.models.memory_probe import transformer_inputs

    x = transformer_inputs("flux", model, args.cells, args.tokens, args.text, dtype=dtype)
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in x.items()}


def run_setting(args, device, lora: bool, mixed: bool, ckpt: bool) -> dict:
    from digenrl.models.memory_probe import AllocationCounter, add_lora

    cuda = device.type == "cuda"
    base_dtype = torch.bfloat16 if (mixed and lora) else torch.float32
    counter = AllocationCounter() if not cuda else None
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    with counter if counter is not None else nullcontext():
        model = _model(args, base_dtype, device)
        if lora:
            add_lora(model, "flux", args.rank)
        if ckpt:
            model.enable_gradient_checkpointing()
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)

        def chunk():
            ctx = torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=not ckpt) if mixed else nullcontext()
            x = _inputs(args, model, device, base_dtype)
            with ctx:
                out = model(**x)[0]
            out.float().square().mean().backward()

        chunk()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            state = torch.cuda.memory_allocated()
        else:
            counter.reset_peak()
            state = counter.live
        t0 = time.perf_counter()
        chunk()
        if cuda:
            torch.cuda.synchronize()
        step_s = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated() if cuda else counter.peak
        del model, opt
    row = {"lora": lora, "mixed_bf16": mixed, "recompute": ckpt, "peak_gib": peak / GiB,
           "state_gib": state / GiB, "act_gib": (peak - state) / GiB, "chunk_s": step_s}
    if not args.tiny:
        from digenrl.train.memory import PlanInputs, plan_memory

        side = int(round(args.tokens ** 0.5)) * 16
        plan = plan_memory(PlanInputs(
            "flux", side, side, text_tokens=args.text, lora_rank=args.rank if lora else None,
            model_dtype="bfloat16" if (mixed and lora) else "float32", mixed_precision="bf16" if mixed else "none",
            activation_checkpointing=ckpt, vae=False, reserve_gb=0.0,
            layers={"transformer_blocks": args.double, "single_transformer_blocks": args.single}))
        row["plan_gib"] = plan.total(args.cells) / GiB
        row["plan_err"] = row["plan_gib"] / row["peak_gib"] - 1
        row["plan_act_gib"] = plan.activations(args.cells) / GiB
        row["plan_act_err"] = row["plan_act_gib"] / row["act_gib"] - 1
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiny", action="store_true", help="64-wide FLUX on CPU (seconds; no plan comparison)")
    p.add_argument("--double", type=int, default=2)
    p.add_argument("--single", type=int, default=4)
    p.add_argument("--cells", type=int, default=2, help="samples in the training chunk")
    p.add_argument("--tokens", type=int, default=1024, help="latent tokens per sample (square; 1024 = 512 px)")
    p.add_argument("--text", type=int, default=128, help="text tokens per sample")
    p.add_argument("--rank", type=int, default=64)
    p.add_argument("--only", default=None, help="comma list of settings to run, e.g. lora-bf16-ckpt,full-fp32")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.tiny:
        args.double, args.single, args.tokens, args.text, args.cells = 1, 2, 16, 8, 2
    torch.set_num_threads(max(1, torch.get_num_threads()) if torch.cuda.is_available() else 1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for lora, mixed, ckpt in itertools.product((True, False), (True, False), (False, True)):
        name = f"{'lora' if lora else 'full'}-{'bf16' if mixed else 'fp32'}{'-ckpt' if ckpt else ''}"
        if args.only and name not in args.only.split(","):
            continue
        rows.append({"setting": name, **run_setting(args, device, lora, mixed, ckpt)})
        print(json.dumps(rows[-1]), flush=True)
    report = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "shape": {k: getattr(args, k) for k in ("double", "single", "cells", "tokens", "text", "rank")},
              "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
