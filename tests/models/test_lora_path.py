"""``model.lora_path`` (issue 24, item 2): a LoRA adapter saved by Flow-GRPO -- ``PeftModel.save_pretrained`` of
``get_peft_model(transformer, LoraConfig(...))``: ``adapter_model.safetensors`` with ``base_model.model.*`` keys +
``adapter_config.json`` -- or in diffusers' format (``pytorch_lora_weights.safetensors``) is the adapter a run
trains on: rank, alpha and targets come from the adapter, the loaded tensors equal the saved ones, the policy
computes what the PEFT model computes, ``digenrl train`` trains it and records the settings in config.yaml; bad
adapters exit 2 naming the key before anything is written."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import tiny_diffusers as td
from test_diffusers_adapters import FAMILIES, TEXTS, model_dirs  # noqa: F401  (fixture)
from digenrl.cli import main
from digenrl.config import ModelConfig
from digenrl.models.lora import FAMILY_TARGETS, save_lora_dir
from digenrl.models.registry import build_policy

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def flow_grpo_adapter(model_path, out, family, r=4, alpha=8, seed=3):
    """What Flow-GRPO's train_sd3.py / train_flux.py save: a PEFT model's save_pretrained (B moved off zero)."""
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel
    from peft import LoraConfig, get_peft_model

    cls = {"sd3": SD3Transformer2DModel, "flux": FluxTransformer2DModel}[family]
    transformer = cls.from_pretrained(str(model_path), subfolder="transformer", local_files_only=True)
    peft_model = get_peft_model(transformer, LoraConfig(r=r, lora_alpha=alpha, init_lora_weights="gaussian",
                                                        target_modules=list(FAMILY_TARGETS[family])))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.add_(0.2 * torch.randn(p.shape, generator=g))
    peft_model.save_pretrained(str(out))
    return peft_model


def _cfg(model_dirs, name, **kw):  # noqa: F811
    fam = FAMILIES[name]
    path, cache = model_dirs[name]
    return ModelConfig(kind=fam.kind, path=str(path), prompt_cache_dir=str(cache) if cache else None,
                       options=dict(fam.options), **kw)


def _adapter_params(policy):
    return {n: p for n, p in policy.named_parameters() if "lora_" in n}


@pytest.mark.parametrize("name", ["sd3", "flux"])
def test_flow_grpo_peft_adapter_loads_as_saved(model_dirs, name, tmp_path):  # noqa: F811
    out = tmp_path / "checkpoint-60" / "lora"
    flow_grpo_adapter(model_dirs[name][0], out, name)
    saved = load_file(str(out / "adapter_model.safetensors"))
    assert all(k.startswith("base_model.model.") for k in saved)  # Flow-GRPO's key layout
    for where in (out, out / "adapter_model.safetensors", out.parent):  # the dir, the file, the checkpoint dir
        policy = build_policy(_cfg(model_dirs, name, lora_path=str(where)))
        params = _adapter_params(policy)
        assert len(params) == len(saved)
        for k, v in saved.items():
            module, _, kind = k[len("base_model.model."):].rpartition(".lora_")
            p = params[f"transformer.{module}.lora_{kind.split('.')[0]}.default.weight"]
            assert p.requires_grad and torch.equal(p.detach(), v.float())
        cfg = policy.transformer.peft_config["default"]
        assert (cfg.r, cfg.lora_alpha) == (4, 8)


def test_policy_computes_the_peft_model(model_dirs, tmp_path):  # noqa: F811
    peft_model = flow_grpo_adapter(model_dirs["sd3"][0], tmp_path / "lora", "sd3")
    policy = build_policy(_cfg(model_dirs, "sd3", lora_path=str(tmp_path / "lora")))
    g = torch.Generator().manual_seed(0)
    kw = dict(hidden_states=torch.randn(2, 4, 8, 8, generator=g), encoder_hidden_states=torch.randn(2, 9, 16, generator=g),
              pooled_projections=torch.randn(2, 8, generator=g), timestep=torch.tensor([500.0, 250.0]), return_dict=False)
    with torch.no_grad():
        want = peft_model(**kw)[0]
        got = policy.transformer(**kw)[0]
        with policy.reference():  # the KL reference: the base model, adapters off
            base = policy.transformer(**kw)[0]
    assert (want - base).abs().max() > 1e-3  # the adapter matters ...
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)  # ... and is applied with Flow-GRPO's scale


def test_diffusers_format_round_trip(model_dirs, tmp_path):  # noqa: F811
    flow_grpo_adapter(model_dirs["sd3"][0], tmp_path / "peft", "sd3")
    policy = build_policy(_cfg(model_dirs, "sd3", lora_path=str(tmp_path / "peft")))
    save_lora_dir(policy.transformer, policy.pipeline_class(), tmp_path / "diffusers")  # pytorch_lora_weights.safetensors, transformer.* keys
    again = build_policy(_cfg(model_dirs, "sd3", lora_path=str(tmp_path / "diffusers")))
    a, b = _adapter_params(policy), _adapter_params(again)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert again.transformer.peft_config["default"].lora_alpha == 8
    # a diffusers file without adapter metadata: rank from the shapes, alpha = rank (diffusers' default)
    state = load_file(str(tmp_path / "diffusers" / "pytorch_lora_weights.safetensors"))
    (tmp_path / "bare").mkdir()
    from safetensors.torch import save_file

    save_file(state, str(tmp_path / "bare" / "pytorch_lora_weights.safetensors"))
    bare = build_policy(_cfg(model_dirs, "sd3", lora_path=str(tmp_path / "bare")))
    assert (bare.transformer.peft_config["default"].r, bare.transformer.peft_config["default"].lora_alpha) == (4, 4)


def _train_args(model_dirs, tmp_path, *extra):  # noqa: F811
    fam = FAMILIES["sd3"]
    path, cache = model_dirs["sd3"]
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(TEXTS) + "\n")
    return ["train", f"run_dir={tmp_path / 'run'}", "steps=1", "model.kind=sd3", f"model.path={path}",
            f"model.prompt_cache_dir={cache}", f"model.options={json.dumps(fam.options)}", "task.name=text",
            f"task.prompts_file={prompts}", "reward={jpeg_incompressibility: 1.0}", "sampler.num_steps=3",
            "train.prompts_per_step=2", "train.generations=2", "train.lr=1e-2", "train.chunk_generations=2",
            "eval.num_prompts=2", "eval.grid_prompts=2", "eval.every=0", "log.progress=false",
            "runtime.checkpoint_every=0", "train.ema_decay=null", *extra]


def test_train_on_a_flow_grpo_adapter(model_dirs, tmp_path, capsys):  # noqa: F811
    flow_grpo_adapter(model_dirs["sd3"][0], tmp_path / "lora", "sd3")
    saved = load_file(str(tmp_path / "lora" / "adapter_model.safetensors"))
    assert main(_train_args(model_dirs, tmp_path, f"model.lora_path={tmp_path / 'lora'}")) == 0
    run = tmp_path / "run"
    lora = (json.loads(json.dumps(__import__("yaml").safe_load((run / "config.yaml").read_text()))))["model"]["lora"]
    assert lora["enabled"] is True and lora["rank"] == 4 and lora["alpha"] == 8.0  # the adapter's settings
    with safe_open(str(run / "checkpoint.safetensors"), "pt") as f:
        trained = {k: f.get_tensor(k) for k in f.keys()}
    b = {k: v for k, v in trained.items() if "lora_B" in k}
    assert len(trained) == len(saved) and b
    moved = [k for k, v in b.items()
             if not torch.equal(v, saved["base_model.model." + k[len("transformer."):].replace(".default", "")])]
    assert moved  # it trained on from the adapter's weights


@pytest.mark.parametrize("setup, extra, message", [
    ("none", ["model.lora_path={tmp}/nope"], "model.lora_path: .*nope.* does not exist"),
    ("empty", ["model.lora_path={tmp}/empty"], "model.lora_path: .*empty.* holds no adapter_model.safetensors"),
    ("adapter", ["model.lora_path={tmp}/lora", "model.lora.rank=8"], "model.lora.rank: 8 .* the adapter .* r=4"),
    ("adapter", ["model.lora_path={tmp}/lora", "model.lora.enabled=false"], "model.lora.enabled: false"),
    ("junk", ["model.lora_path={tmp}/junk.safetensors"], "model.lora_path: .*junk.safetensors.* lora_down"),
])  # fmt: skip
def test_bad_adapters_exit_2_naming_the_key(model_dirs, tmp_path, capsys, setup, extra, message):  # noqa: F811
    if setup == "empty":
        (tmp_path / "empty").mkdir()
    if setup == "adapter":
        flow_grpo_adapter(model_dirs["sd3"][0], tmp_path / "lora", "sd3")
    if setup == "junk":  # a kohya-style file is not a PEFT / diffusers adapter
        from safetensors.torch import save_file

        save_file({"lora_unet_x.lora_down.weight": torch.zeros(2, 2)}, str(tmp_path / "junk.safetensors"))
    args = _train_args(model_dirs, tmp_path, *[e.format(tmp=tmp_path) for e in extra])
    assert main(args) == 2
    import re

    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "run").exists()
