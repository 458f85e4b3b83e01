"""Throughput of the real sampler and trainer paths on a FLUX-architecture policy with random weights.

The transformer is ``FluxTransformer2DModel`` at the real widths (3072 hidden = 24 heads x 128, T5 width
4096, CLIP pooled 768, 64 packed latent channels) with fewer blocks (``--layers`` double-stream blocks and
2x as many single-stream blocks, the FLUX.1 ratio 19:38); the VAE is the FLUX VAE architecture. Text
embeddings are random rows put in the policy's prompt cache (no text encoders). Nothing is downloaded.

Modes (each reports seconds per call and images/s):

* ``sample``: ``sample_trajectories`` with SDE noise and log-probs (guidance embedding, no decode);
* ``decode``: VAE decode of the final latents;
* ``train``: ``train_cells`` forward + backward over the (generation x trained timestep) grid in chunks of
  ``--chunk-gens x --chunk-steps`` cells, then one AdamW step (LoRA or full fine-tuning);
* ``step``: sample + decode + train, the colocated RL step.

``--tiny`` shrinks everything (64 hidden, 1 + 2 blocks, 32 px, tiny VAE) so the script runs on CPU in seconds
and stays exercised by the test suite. Output: one JSON object (also written to ``--out``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling module flux_random
from flux_random import flux_policy, timed  # noqa: E402


def build_policy(args, device: torch.device, dtype: str):
    from digenrl.config import LoraConfig, ModelConfig

    cfg = ModelConfig(kind="flux", dtype=dtype, device=str(device),
                      lora=LoraConfig(enabled=args.lora, rank=args.lora_rank, alpha=2.0 * args.lora_rank),
                      options={"height": args.resolution, "width": args.resolution, "reference_copy": False,
                               "max_sequence_length": 8 if args.tiny else args.text_len})  # fmt: skip
    layers = 1 if args.tiny else args.layers
    return flux_policy(cfg, double=layers, single=2 * layers, tiny=args.tiny,
                       prompts=[f"prompt {i}" for i in range(args.prompts)])


def run(args) -> dict:
    from digenrl.algo.advantage import group_advantages
    from digenrl.algo.timesteps import select_timesteps
    from digenrl.rollout.records import Prompt
    from digenrl.rollout.sampler import SamplerSettings, sample_trajectories
    from digenrl.schedule.layout import tile_grid
    from digenrl.train.chunk_loss import LossSettings, train_cells

    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = "float32" if device.type == "cpu" else args.dtype
    policy = build_policy(args, device, dtype)
    n = args.prompts * args.generations
    prompts = [Prompt(uid=i, text=f"prompt {i}") for i in range(args.prompts) for _ in range(args.generations)]
    gens = [g for _ in range(args.prompts) for g in range(args.generations)]
    settings = SamplerSettings(num_steps=args.steps, noise_level=0.7, cfg_scale=3.5)
    plan = select_timesteps(args.steps, fraction=args.timestep_fraction)
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5)
    loss_settings = LossSettings(clip_range=1e-4, cfg_scale=3.5, noise_level=0.7)
    step = {"k": 0}

    def sample():
        step["k"] += 1
        return sample_trajectories(policy, prompts, gens, step=step["k"], run_seed=0, version=0, settings=settings,
                                   plan=plan, decode=False)  # fmt: skip

    def train(batch):
        batch.rewards = torch.randn(n, generator=torch.Generator().manual_seed(step["k"]))
        batch.advantages = group_advantages(batch.rewards, batch.uids)[0].float()
        group = batch.select(list(range(n)))
        group.gen_index = torch.arange(n)  # one "group" of all rows: cells address rows directly
        scale = 1.0 / (n * len(plan.trained))
        for chunk in tile_grid(list(range(n)), len(plan.trained), args.chunk_gens, args.chunk_steps):
            train_cells(policy, group, chunk, settings=loss_settings, loss_scale=scale)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    results: dict = {}
    t_sample, batch = timed(sample, device, args.repeats)
    results["sample"] = {"seconds": t_sample, "images_per_s": n / t_sample}
    t_decode, _ = timed(lambda: policy.decode(batch.final.to(device)), device, args.repeats)
    results["decode"] = {"seconds": t_decode, "images_per_s": n / t_decode}
    t_train, _ = timed(lambda: train(batch), device, args.repeats)
    cells = n * len(plan.trained)
    results["train"] = {"seconds": t_train, "images_per_s": n / t_train, "cells_per_s": cells / t_train}
    t_step = t_sample + t_decode + t_train
    results["step"] = {"seconds": t_step, "images_per_s": n / t_step}
    n_params = sum(p.numel() for p in policy.transformer.parameters())
    meta = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": dtype, "tiny": args.tiny, "layers": (1 if args.tiny else args.layers),
        "transformer_params": n_params, "trainable_params": sum(p.numel() for p in params),
        "resolution": args.resolution, "latent_tokens": policy.latent_shape[0], "images_per_step": n,
        "sampling_steps": args.steps, "trained_steps": len(plan.trained), "lora": args.lora,
        "peak_memory_gb": (torch.cuda.max_memory_allocated(device) / 2**30) if device.type == "cuda" else None,
    }  # fmt: skip
    return {"meta": meta, "modes": results}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="tiny model on CPU (smoke test)")
    ap.add_argument("--layers", type=int, default=2, help="double-stream blocks (single-stream = 2x)")
    ap.add_argument("--resolution", type=int, default=512)
    ap.add_argument("--text-len", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6, help="sampling steps (Flow-GRPO FLUX: 6)")
    ap.add_argument("--timestep-fraction", type=float, default=0.99)
    ap.add_argument("--chunk-gens", type=int, default=4)
    ap.add_argument("--chunk-steps", type=int, default=1)
    ap.add_argument("--lora", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--lora-rank", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.tiny:
        args.resolution, args.lora_rank = 32, 4
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    report = run(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
