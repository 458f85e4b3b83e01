"""Two RL steps of every diffusers family through ``digenrl train``'s one path (scheduler, control loop, the
colocated worker in this process: ``tests/product.py``)."""

from __future__ import annotations

import json

import pytest
import torch

from test_diffusers_adapters import FAMILIES, TEXTS, model_dirs  # noqa: F401  (fixture)
from digenrl.config import load_config
from product import product_steps, product_worker


@pytest.mark.parametrize("name", list(FAMILIES))
def test_two_rl_steps(model_dirs, name, tmp_path):  # noqa: F811
    fam = FAMILIES[name]
    path, cache = model_dirs[name]
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(TEXTS) + "\n")
    overrides = [
        f"run_dir={tmp_path / 'run'}", "steps=2", f"model.kind={fam.kind}", f"model.path={path}",
        "model.lora.enabled=true", "model.lora.rank=4", "model.lora.alpha=8",
        f"model.options={json.dumps(fam.options)}", "task.name=text", f"task.prompts_file={prompts}",
        "reward={jpeg_incompressibility: {weight: 1.0}}", "sampler.num_steps=3", f"sampler.cfg_scale={fam.cfg}",
        "train.prompts_per_step=2", "train.generations=2", "train.lr=1e-2", "train.beta_kl=0.01",
        "train.chunk_generations=2", "train.chunk_timesteps=2", "eval.num_prompts=2", "eval.grid_prompts=2",
        "eval.every=0", "log.progress=false",
    ]  # fmt: skip
    if cache is not None:
        overrides.append(f"model.prompt_cache_dir={cache}")
    cfg = load_config(None, overrides)
    worker = product_worker(cfg)
    ctx = worker.ctx
    assert type(ctx.ref_policy).__name__ == "ReferenceView"  # KL reference = adapters disabled, no weight copy
    lora_b = {n: p.detach().clone() for n, p in ctx.policy.named_parameters() if "lora_B" in n}
    base = {n: p.detach().clone() for n, p in ctx.policy.named_parameters() if not p.requires_grad}
    _, rows = product_steps(cfg, worker=worker)
    assert ctx.transaction.version == 2 and [r["step"] for r in rows] == [1, 2]
    moved = [n for n, p in ctx.policy.named_parameters() if "lora_B" in n and not torch.equal(p, lora_b[n])]
    assert moved  # the adapters trained ...
    assert all(torch.equal(p, base[n]) for n, p in ctx.policy.named_parameters() if not p.requires_grad)  # ... only
    assert all(r["loss"] == r["loss"] and r["grad_norm"] > 0 for r in rows)
