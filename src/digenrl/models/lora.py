"""LoRA adapters (peft) on the diffusers transformer, the KL reference policy, and diffusers-format export.

LoRA: every targeted linear layer W gets a low-rank update, y = W x + (alpha / r) * B A x, with A (r x in)
Gaussian-initialised and B (out x r) zero, so training starts at the base model. Only A and B are trainable,
so a weight publish (``Policy.trainable_state_dict``) moves only adapter tensors. Adapters are injected with
diffusers' ``PeftAdapterMixin.add_adapter`` (peft underneath), which keeps the transformer's class and forward
signature; adapter parameters are kept in float32 even when the base weights are bf16/fp16.

Default target modules per family follow the published recipes:

* sd3: Flow-GRPO ``scripts/train_sd3.py`` (r=32, alpha=64): attention q/k/v/out on both streams.
* flux: Flow-GRPO ``scripts/train_flux.py`` (r=64, alpha=128): attention of both streams + both feed-forwards.
* wan: Flow-GRPO ``scripts/train_wan2_1.py`` (r=32, alpha=64): to_q/k/v/out (self- and cross-attention).
* qwen_image: Flow-GRPO Qwen-Image recipe (r=64, alpha=128): attention of both streams + img/txt MLPs.
* hunyuan_video: attention projections of both streams (diffusers' HunyuanVideo LoRA layout); DanceGRPO's
  HunyuanVideo runs fine-tune all parameters (``lora.enabled = false``).

Reference policy (KL term): ``reference_context(policy)`` runs the same module with the adapters disabled;
under full fine-tuning it temporarily swaps in a frozen copy of the initial weights (taken at build time)
by replacing the parameter objects, never by in-place copies, so autograd graphs of the live weights survive.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import torch

_ATTN = ("attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0",
         "attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out")  # q, k, v, out of both streams
FAMILY_TARGETS: dict[str, tuple[str, ...]] = {  # (sd3, wan: in the sorted order their scripts list them)
    "sd3": tuple(sorted(_ATTN)),
    "flux": _ATTN + ("ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2"),
    "wan": tuple(sorted(t.removeprefix("attn.") for t in _ATTN)),  # (suffixes: self- and cross-attention)
    "qwen_image": _ATTN + ("img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2"),
    "hunyuan_video": _ATTN,
}  # fmt: skip

ADAPTER = "default"


def apply_lora(transformer: torch.nn.Module, lora_cfg, family: str) -> None:
    """Freeze ``transformer`` and add a trainable LoRA adapter (see the module docstring)."""
    from peft import LoraConfig

    targets = list(lora_cfg.target_modules or FAMILY_TARGETS[family])
    check_targets([n for n, _ in transformer.named_modules()], targets, family)
    transformer.requires_grad_(False)
    cfg = LoraConfig(
        r=lora_cfg.rank,
        lora_alpha=lora_cfg.alpha,
        lora_dropout=lora_cfg.dropout,
        init_lora_weights="gaussian",
        target_modules=targets,
    )
    transformer.add_adapter(cfg, adapter_name=ADAPTER)
    for n, p in transformer.named_parameters():
        if "lora_" in n:
            p.requires_grad_(True)
            p.data = p.data.float()


def check_targets(names: list[str], targets: list[str], family: str) -> None:
    """``ValueError`` naming ``model.lora.target_modules`` unless one target names a module of ``names`` (peft's
    match: the module's name, or its suffix after a dot). ``digenrl check`` / ``train`` run it on the module names
    of the directory's transformer built on the meta device (``diffusers_files.transformer_module_names``)."""
    if not any(n == t or n.endswith("." + t) for t in targets for n in names):
        raise ValueError(f"model.lora.target_modules: none of {targets} matches a module of the {family} transformer")


def has_lora(transformer: torch.nn.Module) -> bool:
    return bool(getattr(transformer, "_hf_peft_config_loaded", False))


def snapshot_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Frozen copies of the trainable parameters (the full fine-tuning reference)."""
    return {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}


@contextlib.contextmanager
def _swap_parameters(module: torch.nn.Module, values: dict[str, torch.Tensor]) -> Iterator[None]:
    saved = []
    try:
        for name, value in values.items():
            owner_name, _, leaf = name.rpartition(".")
            owner = module.get_submodule(owner_name) if owner_name else module
            saved.append((owner, leaf, owner._parameters[leaf]))
            owner._parameters[leaf] = value  # a plain tensor: not trainable inside the context
        yield
    finally:
        for owner, leaf, param in reversed(saved):
            owner._parameters[leaf] = param


@contextlib.contextmanager
def reference_context(transformer: torch.nn.Module, snapshot: dict[str, torch.Tensor] | None) -> Iterator[None]:
    """Inside the context ``transformer`` computes the reference policy (see the module docstring)."""
    if has_lora(transformer):
        transformer.disable_adapters()
        try:
            yield
        finally:
            transformer.enable_adapters()
        return
    if snapshot is None:
        raise RuntimeError(
            "reference policy: full fine-tuning without a reference snapshot (model.options.reference_copy=false)"
        )
    with _swap_parameters(transformer, snapshot):
        yield


def save_lora_dir(transformer: torch.nn.Module, pipeline_cls, out_dir: str | Path) -> Path:
    """Write the adapter of ``transformer`` loadable by ``pipeline_cls.load_lora_weights``
    (``pytorch_lora_weights.safetensors``: ``pipeline_cls.save_lora_weights`` of the adapter tensors in diffusers'
    transformer LoRA naming, ``...to_q.lora_A.weight``, with the adapter config as metadata, so the alpha / rank
    scale survives the round trip)."""
    from peft.utils import get_peft_model_state_dict

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not has_lora(transformer):
        raise ValueError("save_lora_dir: the policy has no LoRA adapter (model.lora.enabled is false)")
    state = {k: v.detach().cpu() for k, v in get_peft_model_state_dict(transformer, adapter_name=ADAPTER).items()}
    metadata = transformer.peft_config[ADAPTER].to_dict()
    pipeline_cls.save_lora_weights(
        str(out),
        transformer_lora_layers=state,
        transformer_lora_adapter_metadata=metadata,
        safe_serialization=True,
    )
    return out
