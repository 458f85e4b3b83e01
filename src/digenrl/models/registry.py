"""Name -> policy builder. Families register a builder taking the ``ModelConfig``; heavy imports stay inside."""

from __future__ import annotations

from typing import Callable, Sequence

from digenrl.models.base import Policy, copy_tensors
from digenrl.models.specs import SPECS

_BUILDERS: dict[str, str] = {  # kind: "module:function" (imported lazily: optional dependencies load only when used)
    "tiny_dit": "digenrl.models.tiny_dit:build_tiny_dit_policy",
    # the registry's diffusers families: the builder is their policy class's ``build`` (``family_policy_class``)
    **{kind: f"digenrl.models.diffusers_{kind}:" for kind in SPECS},
}


def policy_kinds() -> list[str]:
    return sorted(_BUILDERS)


def _module(kind: str):
    """(the builder's module, its function name) of ``kind``."""
    import importlib

    target = _BUILDERS.get(kind)
    if target is None:
        raise ValueError(f"model.kind: unknown policy kind {kind!r}; expected one of {policy_kinds()}")
    module, fn = target.split(":")
    return importlib.import_module(module), fn


def build_policy(model_cfg) -> Policy:
    """Build the policy for ``model_cfg.kind`` (see ``digenrl.config.ModelConfig``)."""
    from digenrl.models.lora_files import load_adapter, resolve_lora

    module, fn = _module(model_cfg.kind)
    builder: Callable = getattr(module, fn) if fn else family_policy_class(model_cfg.kind).build
    model_cfg = resolve_lora(model_cfg)  # a LoRA adapter to train on (model.lora_path): its rank / alpha / targets
    policy = builder(model_cfg)
    if getattr(model_cfg, "lora_path", None):
        load_adapter(policy, model_cfg.lora_path)
    if getattr(model_cfg, "checkpoint", None):  # a run's trained weights, over the adapter's
        load_weights(policy, model_cfg.checkpoint)
    return policy


def load_weights(policy: Policy, path: str) -> None:
    """Load a run's ``checkpoint.safetensors`` (its trainable tensors: all weights, or the LoRA adapters under
    LoRA, which then need the run's ``model.lora`` settings) into a freshly built policy."""
    from safetensors.torch import load_file

    copy_tensors(dict(policy.named_parameters()), load_file(path), lambda problem: ValueError(
        f"model.checkpoint: {path!r} {problem}; build the model as the run did (model.kind, model.lora)"))


def family_policy_class(kind: str):
    """The ``DiffusersPolicy`` subclass of a diffusers family ``kind`` (None for other kinds, e.g. tiny_dit)."""
    from digenrl.models.diffusers_common import DiffusersPolicy

    module, _ = _module(kind)
    return next((v for v in vars(module).values() if isinstance(v, type) and issubclass(v, DiffusersPolicy)
                 and getattr(getattr(v, "spec", None), "name", None) == kind), None)


def run_encoder_id(model_cfg) -> str | None:
    """The prompt-cache encoder id this model directory's text encoders give with these encoding options (as
    ``DiffusersPolicy._encoder_id_from_pipe``), from the config files alone; None for a non-diffusers kind."""
    cls = family_policy_class(model_cfg.kind)
    if cls is None or not model_cfg.path:
        return None
    return cls.spec.encoder_id(model_cfg.path, cls.spec.options(model_cfg.options))


def prompt_cache_covers(model_cfg, texts: Sequence[str]) -> bool:
    """True when ``model.prompt_cache_dir`` holds the embeddings of every text in ``texts`` and of the negative
    prompt, made by this model directory's text encoders with these encoding options (same encoder id as
    ``_encoder_id_from_pipe``): then a worker never needs the text encoders."""
    from digenrl.models.prompt_cache import PromptCache

    cache_dir = model_cfg.prompt_cache_dir
    enc_id = run_encoder_id(model_cfg) if cache_dir else None
    if enc_id is None or enc_id not in PromptCache.read_encoder_ids(cache_dir):
        return False
    negative = str(family_policy_class(model_cfg.kind).spec.options(model_cfg.options).get("negative_prompt", ""))
    return not PromptCache(cache_dir, enc_id).uncovered(list(texts) + [negative])
