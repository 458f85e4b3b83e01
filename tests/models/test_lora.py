"""LoRA: diffusers-format export reloads in the family pipeline; LoRA-only publish; the KL reference policy."""

from __future__ import annotations

import pytest
import torch

import tiny_diffusers as td
from digenrl.config import LoraConfig, ModelConfig
from digenrl.models.lora import FAMILY_TARGETS, save_lora_dir
from digenrl.models.registry import build_policy
from digenrl.rollout.records import Prompt

PROMPTS = [Prompt(0, "a red cat"), Prompt(1, "a big dog")]


@pytest.fixture(scope="module")
def flux_dir(tmp_path_factory):
    return td.save_flux(tmp_path_factory.mktemp("flux") / "model")


def flux_policy(path, lora: bool, seed: int = 0):
    torch.manual_seed(seed)
    cfg = ModelConfig(kind="flux", path=str(path), lora=LoraConfig(enabled=lora, rank=4, alpha=8.0),
                      options={"height": 16, "width": 16, "max_sequence_length": 8})  # fmt: skip
    return build_policy(cfg)


def perturb_lora(policy, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))


def euler(policy, x, cond, steps=3, guidance=3.5):
    sig = policy.sigmas(steps)
    with torch.no_grad():
        for i in range(steps):
            v = policy(x, sig[i].expand(x.shape[0]), cond, guidance=guidance)
            x = x + (sig[i + 1] - sig[i]) * v
    return x


def test_export_reloads_with_load_lora_weights(flux_dir, tmp_path):
    from diffusers import FluxPipeline

    policy = flux_policy(flux_dir, lora=True)
    perturb_lora(policy)
    save_lora_dir(policy.transformer, policy.pipeline_class(), tmp_path / "lora")
    assert (tmp_path / "lora" / "pytorch_lora_weights.safetensors").is_file()

    cond = policy.encode_prompts(PROMPTS)
    x_t = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(0))
    pipe = FluxPipeline.from_pretrained(str(flux_dir), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    kw = dict(prompt_embeds=cond["prompt_embeds"], pooled_prompt_embeds=cond["pooled_prompt_embeds"],
              num_inference_steps=3, guidance_scale=3.5, height=16, width=16, output_type="latent")  # fmt: skip
    base = pipe(latents=x_t.clone(), **kw).images
    pipe.load_lora_weights(str(tmp_path / "lora"))
    tuned = pipe(latents=x_t.clone(), **kw).images
    assert (tuned - base).abs().max() > 1e-3  # the LoRA changes the pipeline output ...
    torch.testing.assert_close(tuned, euler(policy, x_t.clone(), cond), atol=2e-4, rtol=1e-4)  # ... to ours
    with policy.reference():
        torch.testing.assert_close(euler(policy, x_t.clone(), cond), base, atol=2e-4, rtol=1e-4)


def test_lora_only_publish_moves_adapter_tensors(flux_dir):
    trainer, generator = flux_policy(flux_dir, lora=True, seed=0), flux_policy(flux_dir, lora=True, seed=5)
    perturb_lora(trainer)
    state = trainer.trainable_state_dict()
    n_lora = sum(1 for n, _ in trainer.named_parameters() if "lora_" in n)
    assert state and len(state) == n_lora and all("lora_" in k for k in state)
    total = sum(p.numel() for p in trainer.parameters())
    assert sum(v.numel() for v in state.values()) < 0.5 * total
    cond = trainer.encode_prompts(PROMPTS)
    x = torch.randn(2, *trainer.latent_shape)
    s = torch.full((2,), 0.6)
    assert not torch.allclose(trainer(x, s, cond, guidance=3.5), generator(x, s, cond, guidance=3.5))
    generator.load_trainable_state_dict(state)
    torch.testing.assert_close(generator(x, s, cond, guidance=3.5), trainer(x, s, cond, guidance=3.5))


def test_full_finetune_reference_keeps_initial_weights_and_graph(flux_dir):
    policy = flux_policy(flux_dir, lora=False)
    assert all(p.requires_grad for p in policy.transformer.parameters())
    cond = policy.encode_prompts(PROMPTS[:1])
    x, s = torch.randn(1, *policy.latent_shape), torch.full((1,), 0.5)
    with torch.no_grad():
        v0 = policy(x, s, cond, guidance=3.5)
    opt = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=0.1)
    policy(x, s, cond, guidance=3.5).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    live = policy(x, s, cond, guidance=3.5)  # graph kept across the reference forward
    with torch.no_grad(), policy.reference():
        ref = policy(x, s, cond, guidance=3.5)
    torch.testing.assert_close(ref, v0)
    assert not torch.allclose(live.detach(), v0)
    live.pow(2).mean().backward()  # would fail if the reference swap had modified saved tensors in place
    assert all(p.grad is not None for p in policy.transformer.parameters() if p.requires_grad and p.dim() > 1)


def test_lora_targets_cover_each_family():
    assert set(FAMILY_TARGETS) == {"sd3", "flux", "wan", "qwen_image", "hunyuan_video"}


def test_unknown_target_modules_are_refused(flux_dir):
    cfg = ModelConfig(kind="flux", path=str(flux_dir), options={"height": 16, "width": 16},
                      lora=LoraConfig(enabled=True, rank=2, alpha=2.0, target_modules=["no_such_layer"]))  # fmt: skip
    with pytest.raises(ValueError, match="no_such_layer"):
        build_policy(cfg)
