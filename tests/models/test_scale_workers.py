"""Workers that carry only what they need: fp32 VAE, no text encoders when the prompt cache covers the task,
batched / tiled VAE decoding, Wan2.2 MoE refused, the UniPC grid difference reported."""

from __future__ import annotations

import json

import pytest
import torch

import tiny_diffusers as td
from digenrl.config import ModelConfig, load_config
from digenrl.models.registry import build_policy

OPTS = {"height": 16, "width": 16, "max_sequence_length": 8}
TEXTS = ["a red cat", "a big dog", "a small dog"]


@pytest.fixture(scope="module")
def flux_dir(tmp_path_factory):
    return td.save_flux(tmp_path_factory.mktemp("flux") / "model")


def test_vae_is_loaded_in_fp32_not_upcast(flux_dir):
    from safetensors.torch import load_file

    from digenrl.models.diffusers_files import load_pipeline
    from digenrl.models.diffusers_flux import FluxPolicy

    pipe = load_pipeline(FluxPolicy.pipeline_class(), str(flux_dir), "bfloat16", [])
    assert pipe.transformer.dtype == torch.bfloat16
    saved = {k: v for f in (flux_dir / "vae").glob("*.safetensors") for k, v in load_file(str(f)).items()}
    got = dict(pipe.vae.state_dict())
    assert all(got[k].dtype == torch.float32 for k in saved)
    assert any(not torch.equal(v, v.bfloat16().float()) for v in saved.values())  # not bf16-representable
    assert all(torch.equal(got[k], v) for k, v in saved.items())  # exact: never rounded through bf16


def _text_cfg(tmp_path, flux_dir, texts):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(texts) + "\n")
    return load_config(None, [
        f"run_dir={tmp_path / 'run'}", "model.kind=flux", f"model.path={flux_dir}", f"model.options={json.dumps(OPTS)}",
        f"model.prompt_cache_dir={tmp_path / 'cache'}", "model.lora.enabled=true", "model.lora.rank=2",
        "task.name=text", f"task.prompts_file={prompts}", "reward={jpeg_incompressibility: {weight: 1.0}}",
    ])  # fmt: skip


def test_no_text_encoders_when_the_cache_covers_the_task(flux_dir, tmp_path):
    from digenrl.train.context import build_context

    builder = build_policy(ModelConfig(kind="flux", path=str(flux_dir), prompt_cache_dir=str(tmp_path / "cache"),
                                       options=OPTS))
    builder.cache_prompts(TEXTS[:2])
    covered = build_context(_text_cfg(tmp_path, flux_dir, TEXTS[:2]))
    assert not covered.policy.has_text_encoders
    assert covered.policy._pipe.text_encoder_2 is None  # never loaded
    expected = builder.encode_prompts(TEXTS[:2])
    got = covered.policy.encode_prompts(TEXTS[:2])
    for k in expected:
        torch.testing.assert_close(got[k], expected[k])
    uncovered = build_context(_text_cfg(tmp_path, flux_dir, TEXTS))  # "a small dog" is not cached
    assert uncovered.policy.has_text_encoders


def test_vae_batch_decodes_in_chunks_with_the_same_result(flux_dir):
    whole = build_policy(ModelConfig(kind="flux", path=str(flux_dir), options=OPTS))
    batched = build_policy(ModelConfig(kind="flux", path=str(flux_dir), options={**OPTS, "vae_batch": 2}))
    calls = []
    orig = batched.vae.decode
    batched.vae.decode = lambda z, **k: (calls.append(z.shape[0]), orig(z, **k))[1]
    z = torch.randn(5, *whole.latent_shape)
    torch.testing.assert_close(batched.decode(z), whole.decode(z))
    assert calls == [2, 2, 1]
    with pytest.raises(ValueError, match="vae_batch"):
        build_policy(ModelConfig(kind="flux", path=str(flux_dir), options={**OPTS, "vae_batch": 0}))


@pytest.fixture(scope="module")
def wan_dir(tmp_path_factory):
    return td.save_wan(tmp_path_factory.mktemp("wan") / "model")


WAN_OPTS = {"height": 16, "width": 16, "frames": 5, "max_sequence_length": 8}


def test_video_vae_tiling_option(wan_dir, tmp_path):
    td.random_cache(tmp_path / "c", "wan-test", TEXTS + [""], {"prompt_embeds": (8, 16)})
    pol = build_policy(ModelConfig(kind="wan", path=str(wan_dir), prompt_cache_dir=str(tmp_path / "c"),
                                   options={**WAN_OPTS, "vae_tiling": True, "vae_batch": 1}))
    assert pol.vae.use_tiling


def test_wan22_moe_checkpoint_is_refused(wan_dir, tmp_path):
    import shutil

    moe = tmp_path / "moe"
    shutil.copytree(wan_dir, moe)
    index = json.loads((moe / "model_index.json").read_text())
    index.update(transformer_2=["diffusers", "WanTransformer3DModel"], boundary_ratio=0.875)
    (moe / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="Wan2.2 mixture-of-experts.*boundary_ratio=0.875"):
        build_policy(ModelConfig(kind="wan", path=str(moe), options=WAN_OPTS))


def test_unipc_grid_difference_is_reported(wan_dir, tmp_path):
    import shutil

    from diffusers import UniPCMultistepScheduler

    uni = tmp_path / "uni"
    shutil.copytree(wan_dir, uni)
    shutil.rmtree(uni / "scheduler")
    UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0).save_pretrained(
        str(uni / "scheduler"))
    index = json.loads((uni / "model_index.json").read_text())
    index["scheduler"] = ["diffusers", "UniPCMultistepScheduler"]
    (uni / "model_index.json").write_text(json.dumps(index))
    td.random_cache(tmp_path / "c", "wan-test", TEXTS + [""], {"prompt_embeds": (8, 16)})
    with pytest.warns(UserWarning, match="UniPCMultistepScheduler.*flow_shift=3.0"):
        build_policy(ModelConfig(kind="wan", path=str(uni), prompt_cache_dir=str(tmp_path / "c"), options=WAN_OPTS))


@pytest.mark.parametrize("beta", [0.0, 0.01])
def test_reference_copy_only_when_the_kl_term_needs_it(flux_dir, tmp_path, beta):
    from digenrl.train.context import build_context

    cfg = _text_cfg(tmp_path, flux_dir, TEXTS[:2])
    cfg = load_config(None, [f"{k}={json.dumps(v)}" for k, v in [
        ("run_dir", str(tmp_path / "run")), ("model.kind", "flux"), ("model.path", str(flux_dir)),
        ("model.options", OPTS), ("model.lora.enabled", False), ("train.beta_kl", beta), ("task.name", "text"),
        ("task.prompts_file", cfg.task.prompts_file), ("reward", {"jpeg_incompressibility": {"weight": 1.0}})]])
    ctx = build_context(cfg)
    has_copy = ctx.policy._reference_snapshot is not None
    assert has_copy == (beta > 0)
    assert (ctx.ref_policy is not None) == (beta > 0)
