"""Diffusers policy adapters on tiny random models saved in the standard layout.

Oracle: the family's own diffusers pipeline, called with the same initial latents and prompt embeddings
(``output_type="latent"``), must reproduce the adapter's ODE path (sampler with noise_level 0), including CFG /
guidance embedding and the family's sigma schedule; its decoded output must equal ``policy.decode``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest
import torch

import tiny_diffusers as td
from digenrl.algo.sde import sde_step_with_logprob
from digenrl.algo.timesteps import select_timesteps
from digenrl.config import LoraConfig, ModelConfig
from digenrl.models.base import guided_velocity
from digenrl.models.dir_checks import latent_grid
from digenrl.models.registry import build_policy
from digenrl.rollout.noise import trajectory_noise, trajectory_seed
from digenrl.rollout.records import Prompt
from digenrl.rollout.sampler import SamplerSettings, sample_trajectories

TEXTS = ["a red cat", "a big dog"]
STEPS = 3


@dataclass(frozen=True)
class Family:
    kind: str
    save: Callable
    options: dict
    cond_shapes: dict | None  # None: real (tiny) text encoders
    masks: dict | None
    cfg: float
    pipeline_kwargs: Callable  # (cond, null) -> kwargs of the pipeline call


def _sd3_kwargs(c, u):
    return dict(prompt_embeds=c["prompt_embeds"], pooled_prompt_embeds=c["pooled_prompt_embeds"],
                negative_prompt_embeds=u["prompt_embeds"], negative_pooled_prompt_embeds=u["pooled_prompt_embeds"],
                guidance_scale=3.0, height=16, width=16)  # fmt: skip


def _flux_kwargs(c, u):
    return dict(prompt_embeds=c["prompt_embeds"], pooled_prompt_embeds=c["pooled_prompt_embeds"],
                guidance_scale=3.5, height=16, width=16)  # fmt: skip


def _wan_kwargs(c, u):
    return dict(prompt_embeds=c["prompt_embeds"], negative_prompt_embeds=u["prompt_embeds"], guidance_scale=4.0,
                height=16, width=16, num_frames=3)  # fmt: skip


def _qwen_kwargs(c, u):
    return dict(prompt_embeds=c["prompt_embeds"], prompt_embeds_mask=c["prompt_mask"],
                negative_prompt_embeds=u["prompt_embeds"], negative_prompt_embeds_mask=u["prompt_mask"],
                true_cfg_scale=4.0, height=16, width=16)  # fmt: skip


def _hunyuan_kwargs(c, u):
    return dict(prompt_embeds=c["prompt_embeds"], pooled_prompt_embeds=c["pooled_prompt_embeds"],
                prompt_attention_mask=c["prompt_mask"], guidance_scale=6.0, height=16, width=16, num_frames=5)  # fmt: skip


FAMILIES = {
    "sd3": Family("sd3", td.save_sd3, {"height": 16, "width": 16}, td.SD3_COND, None, 3.0, _sd3_kwargs),
    "flux": Family("flux", td.save_flux, {"height": 16, "width": 16, "max_sequence_length": 8}, None, None, 3.5,
                   _flux_kwargs),
    "wan": Family("wan", td.save_wan, {"height": 16, "width": 16, "frames": 3}, {"prompt_embeds": (6, 16)}, None, 4.0,
                  _wan_kwargs),
    "qwen_image": Family("qwen_image", td.save_qwen_image, {"height": 16, "width": 16},
                         {"prompt_embeds": (6, 16)}, {"prompt_mask": 5}, 4.0, _qwen_kwargs),
    "hunyuan_video": Family("hunyuan_video", td.save_hunyuan_video, {"height": 16, "width": 16, "frames": 5},
                            {"prompt_embeds": (6, 16), "pooled_prompt_embeds": (8,)}, {"prompt_mask": 4}, 6.0,
                            _hunyuan_kwargs),
}  # fmt: skip


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    out = {}
    for name, fam in FAMILIES.items():
        path = fam.save(root / name)
        cache = None
        if fam.cond_shapes is not None:
            cache = root / f"{name}-cache"
            td.random_cache(cache, f"{name}-test", TEXTS + [" ", ""], fam.cond_shapes, masks=fam.masks)
        out[name] = (path, cache)
    return out


def make_policy(model_dirs, name, **kw) -> torch.nn.Module:
    fam = FAMILIES[name]
    path, cache = model_dirs[name]
    cfg = ModelConfig(kind=fam.kind, path=str(path), prompt_cache_dir=str(cache) if cache else None,
                      options=dict(fam.options), **kw)  # fmt: skip
    return build_policy(cfg)


def load_pipeline(policy, path):
    cls = policy.pipeline_class()
    skip = {c: None for c in policy.spec.text_components + policy.spec.extra_components}
    pipe = cls.from_pretrained(str(path), local_files_only=True, **skip)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize("name", list(FAMILIES))
def test_sizes_off_the_latent_grid_are_refused_from_the_configs(model_dirs, name):
    """``dir_checks.check_resolution`` (what ``digenrl check`` / ``train`` run before anything loads): the tiny
    family's working size passes; a height or width one pixel off the grid and, for video, a frame count off the
    VAE's time factor are refused naming the option and a size that fits."""
    from digenrl.models.dir_checks import check_resolution

    fam, path = FAMILIES[name], str(model_dirs[name][0])
    check_resolution(path, fam.kind, fam.options)
    grid = latent_grid(path, fam.kind)
    for key in ("height", "width"):
        with pytest.raises(ValueError, match=rf"^model.options.{key}: 17 is not a multiple of \d+ for {fam.kind} "
                                             rf".*use e.g. 16$"):
            check_resolution(path, fam.kind, {**fam.options, key: 17})
    if "frames" in fam.options:
        frames = fam.options["frames"] + 1
        with pytest.raises(ValueError, match=rf"^model.options.frames: {frames} - 1 is not a multiple of "
                                             rf"{grid.temporal} for {fam.kind}"):
            check_resolution(path, fam.kind, {**fam.options, "frames": frames})
    else:
        assert grid.temporal is None


@pytest.mark.parametrize("name", list(FAMILIES))
def test_ode_path_matches_diffusers_pipeline(model_dirs, name):
    fam = FAMILIES[name]
    policy = make_policy(model_dirs, name)
    prompts = [Prompt(uid=i, text=t) for i, t in enumerate(TEXTS)]
    plan = select_timesteps(STEPS)
    settings = SamplerSettings(num_steps=STEPS, noise_level=0.0, cfg_scale=fam.cfg)
    batch = sample_trajectories(policy, prompts, [0, 1], step=0, run_seed=7, version=0, settings=settings, plan=plan)

    x_t = torch.stack([
        trajectory_noise(trajectory_seed(7, 0, p.uid, g), tuple(policy.latent_shape), STEPS)[0]
        for p, g in zip(prompts, [0, 1])
    ])  # fmt: skip
    cond, null = policy.encode_prompts(prompts), policy.null_cond(len(prompts))
    pipe = load_pipeline(policy, model_dirs[name][0])
    kwargs = fam.pipeline_kwargs(cond, {k: v.contiguous() for k, v in null.items()})
    out = pipe(latents=x_t.clone(), num_inference_steps=STEPS, output_type="latent", **kwargs)
    ref = out[0] if isinstance(out, tuple) else (out.images if hasattr(out, "images") else out.frames)
    assert ref.shape == batch.final.shape
    assert not torch.allclose(ref, x_t, atol=1e-2)  # the oracle actually denoised
    torch.testing.assert_close(batch.final, ref.float(), atol=2e-4, rtol=1e-4)

    # the scheduler's sigmas equal the policy's
    torch.testing.assert_close(policy.sigmas(STEPS), pipe.scheduler.sigmas.float().cpu(), atol=1e-6, rtol=0)
    # the latent grid `digenrl check` reads from the directory's configs is the loaded modules' (the pipeline's own
    # scale factors), so the size rule refuses up front exactly what the build would
    assert latent_grid(str(model_dirs[name][0]), fam.kind) == policy.latent_grid()
    # decode equals the pipeline's pixel output on the same final latents
    img = pipe(latents=x_t.clone(), num_inference_steps=STEPS, output_type="pt", **kwargs)
    img = img[0] if isinstance(img, tuple) else (img.images if hasattr(img, "images") else img.frames)
    mine = batch.images
    if mine.ndim == 5:  # video: ours [B, C, F, H, W], the pipeline's "pt" frames [B, F, C, H, W]
        mine = mine.permute(0, 2, 1, 3, 4)
    torch.testing.assert_close(mine, img.float(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "name, lora", [(n, True) for n in FAMILIES] + [("sd3", False), ("wan", False)]  # full FT: image + video
)
def test_sde_logprob_recomputes_and_backward_reaches_trainable_params(model_dirs, name, lora):
    fam = FAMILIES[name]
    policy = make_policy(model_dirs, name, lora=LoraConfig(enabled=lora, rank=4, alpha=8.0))
    prompts = [Prompt(uid=0, text=TEXTS[0])]
    plan = select_timesteps(STEPS, fraction=0.67)
    settings = SamplerSettings(num_steps=STEPS, noise_level=0.7, cfg_scale=fam.cfg)
    batch = sample_trajectories(policy, prompts * 2, [0, 1], step=1, run_seed=3, version=0, settings=settings, plan=plan)
    assert batch.images.min() >= 0 and batch.images.max() <= 1
    assert torch.isfinite(batch.log_probs).all() and (batch.log_probs != 0).all()

    cond = {k: v.repeat_interleave(2, dim=0) for k, v in policy.encode_prompts(prompts).items()}
    adv = torch.tensor([1.0, -1.0])
    total = 0.0
    for j, i in enumerate(batch.trained_steps.tolist()):
        s, s_next = batch.sigmas[i], batch.sigmas[i + 1]
        x = batch.latents[:, j]
        v = guided_velocity(policy, x, s.expand(2), cond, fam.cfg)
        out = sde_step_with_logprob(x, v, s, s_next, noise_level=0.7, prev_sample=batch.next_latents[:, j])
        torch.testing.assert_close(out.log_prob.detach(), batch.log_probs[:, j], atol=1e-3, rtol=1e-4)
        total = total + (-adv * torch.exp(out.log_prob - batch.log_probs[:, j])).mean()
    total.backward()
    trainable = {n: p for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable
    assert all(("lora_" in n) == lora for n in trainable)
    assert all(not n.startswith("vae.") for n in trainable)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainable.values())
    frozen = [p for n, p in policy.named_parameters() if not p.requires_grad]
    assert all(p.grad is None for p in frozen)
