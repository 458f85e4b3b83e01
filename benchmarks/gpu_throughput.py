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
import time
from pathlib import Path

import torch


def build_policy(args, device: torch.device, dtype: str):
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    from digenrl.config import LoraConfig, ModelConfig
    from digenrl.models.diffusers_flux import FluxPolicy
    from digenrl.models.diffusers_files import DTYPES

    torch.manual_seed(0)
    if args.tiny:
        tr = FluxTransformer2DModel(in_channels=16, num_layers=1, num_single_layers=2, attention_head_dim=16,
                                    num_attention_heads=4, joint_attention_dim=32, pooled_projection_dim=16,
                                    guidance_embeds=True, axes_dims_rope=(4, 6, 6))  # fmt: skip
        vae = AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                            block_out_channels=(8, 8), latent_channels=4, norm_num_groups=4,
                            scaling_factor=0.3611, shift_factor=0.1159)  # fmt: skip
        text = (8, 32, 16)
    else:
        tr = FluxTransformer2DModel(num_layers=args.layers, num_single_layers=2 * args.layers, guidance_embeds=True)
        vae = AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                            block_out_channels=(128, 256, 512, 512), layers_per_block=2, latent_channels=16,
                            scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False,
                            use_post_quant_conv=False)  # fmt: skip
        text = (args.text_len, 4096, 768)
    sched = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15)
    pipe = FluxPipeline(transformer=tr.to(device, DTYPES[dtype]), scheduler=sched, vae=vae.to(device),
                        text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None)  # fmt: skip
    cfg = ModelConfig(kind="flux", dtype=dtype, device=str(device),
                      lora=LoraConfig(enabled=args.lora, rank=args.lora_rank, alpha=2.0 * args.lora_rank),
                      options={"height": args.resolution, "width": args.resolution,
                               "max_sequence_length": text[0], "reference_copy": False})  # fmt: skip
    policy = FluxPolicy(pipe, cfg, encoder_id="benchmark-random")
    texts = [f"prompt {i}" for i in range(args.prompts)] + [policy.negative_prompt]
    g = torch.Generator().manual_seed(1)
    policy.prompt_cache.put(texts, {
        "prompt_embeds": torch.randn(len(texts), text[0], text[1], generator=g).to(DTYPES[dtype]),
        "pooled_prompt_embeds": torch.randn(len(texts), text[2], generator=g).to(DTYPES[dtype]),
    })  # fmt: skip
    return policy


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeats: int):
    fn()  # warm-up (kernels, allocator)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        out = fn()
    sync(device)
    return (time.perf_counter() - t0) / repeats, out


def run(args) -> dict:
    from digenrl.algo.advantage import group_advantages
    from digenrl.algo.timesteps import select_timesteps
    from digenrl.rollout.records import Prompt
    from digenrl.rollout.sampler import SamplerSettings, sample_trajectories
    from digenrl.schedule.layout import tile_grid
    from digenrl.train import LossSettings, train_cells

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
