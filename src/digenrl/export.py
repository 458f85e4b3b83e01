"""Trained artifacts: export a run to diffusers formats, and load a trained checkpoint or adapter into a policy.

A run directory holds ``config.yaml`` (the base model: ``model.kind``, ``model.path``, LoRA settings) and
``checkpoint.safetensors`` (the final trained weights, EMA weights when EMA is on): the policy's trainable
parameters under their module names -- ``transformer.<module>.lora_{A,B}.default.weight`` under LoRA, or
``transformer.<param>`` under full fine-tuning (the tiny demo model stores its whole state dict).

``digenrl export RUN_DIR --out DIR [--format auto|lora|full]`` writes, for the diffusers families:

* ``lora`` (default for LoRA runs): ``DIR/pytorch_lora_weights.safetensors`` in diffusers' LoRA naming, with
  the adapter config (rank, alpha, targets) as metadata, via the family pipeline's ``save_lora_weights``:
  ``Pipeline.from_pretrained(base).load_lora_weights(DIR)`` reproduces the trained policy.
* ``full`` (default for full fine-tuning; for LoRA runs the adapters are merged, W' = W + (alpha / r) B A):
  ``DIR/config.json`` + ``DIR/diffusion_pytorch_model.safetensors`` of the transformer, no ``transformer.``
  prefix: ``<Family>Transformer.from_pretrained(DIR)`` loads it, and it can replace the base pipeline's
  ``transformer/`` subfolder.

Only the transformer is built for an export (no text encoders, no VAE). For ``tiny_dit`` runs the checkpoint is
already the loadable artifact; it is copied to ``DIR/model.safetensors``.

``apply_checkpoint(policy, path)`` (``digenrl eval|sample --checkpoint PATH``) accepts a run directory, a
``checkpoint.safetensors``, an exported LoRA (directory or file) or an exported transformer directory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Literal

import torch

from digenrl.models.base import copy_tensors

CHECKPOINT = "checkpoint.safetensors"
LORA_FILE = "pytorch_lora_weights.safetensors"
PREFIX = "transformer."


class ArtifactError(ValueError):
    """A run directory, checkpoint or adapter that cannot be used; the message names the path."""


def read_run(run_dir: str | Path):
    """(config, checkpoint path) of a finished run directory."""
    from digenrl.config import ConfigError, load_config

    root = Path(run_dir).expanduser()
    if not root.is_dir():
        raise ArtifactError(f"run directory {str(root)!r} does not exist")
    ckpt = root / CHECKPOINT
    for f in (root / "config.yaml", ckpt):
        if not f.is_file():
            raise ArtifactError(f"run directory {str(root)!r} has no {f.name} (is the run finished?)")
    try:
        return load_config(root / "config.yaml"), ckpt
    except ConfigError as e:
        raise ArtifactError(f"{str(root / 'config.yaml')!r}: {e}") from None


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise ArtifactError(f"{str(path)!r} is not a readable safetensors file: {e}") from None


def load_trained_transformer(cfg, checkpoint: Path) -> torch.nn.Module:
    """The base transformer of ``cfg.model`` (with LoRA adapters if the run used them) holding the trained
    weights of ``checkpoint``; every checkpoint tensor must match a parameter (name and shape)."""
    import diffusers

    from digenrl.models.diffusers_files import DTYPES, check_model_dir
    from digenrl.models.lora import apply_lora

    index = check_model_dir(cfg.model.path, cfg.model.kind, ("transformer",))  # model_index.json names the class
    try:
        cls = getattr(diffusers, index["transformer"][1])
    except KeyError as e:
        index_file = Path(cfg.model.path).expanduser() / "model_index.json"
        raise ArtifactError(f"{str(index_file)!r}: cannot read the transformer class ({e!r})") from None
    transformer = cls.from_pretrained(str(Path(cfg.model.path).expanduser()), subfolder="transformer",
                                      local_files_only=True, torch_dtype=DTYPES[cfg.model.dtype])  # fmt: skip
    if cfg.model.lora.enabled:
        apply_lora(transformer, cfg.model.lora, cfg.model.kind)
    state = {k.removeprefix(PREFIX): v for k, v in _load_safetensors(checkpoint).items()}
    params = dict(transformer.named_parameters())
    copy_tensors(params, state, lambda problem: ArtifactError(
        f"{str(checkpoint)!r} {problem} (the {cfg.model.kind} transformer of {cfg.model.path!r}); wrong base model "
        "or LoRA settings?"), required=[n for n, p in params.items() if p.requires_grad])  # fmt: skip
    return transformer


def export_run(run_dir: str | Path, out_dir: str | Path, fmt: Literal["auto", "lora", "full"] = "auto") -> dict:
    """Write the trained policy of ``run_dir`` to ``out_dir`` (see the module docstring); returns a summary."""
    from digenrl.models.lora import save_lora_dir

    cfg, ckpt = read_run(run_dir)
    out = Path(out_dir).expanduser()
    if cfg.model.kind == "tiny_dit":
        if fmt == "lora":
            raise ArtifactError("export --format lora: tiny_dit runs train all weights (no LoRA)")
        _load_safetensors(ckpt)
        from digenrl.models.tiny_dit import TinyDiTPolicy

        try:
            TinyDiTPolicy.load(ckpt)
        except Exception as e:
            raise ArtifactError(f"{str(ckpt)!r} is not a tiny_dit checkpoint: {e}") from None
        out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ckpt, out / "model.safetensors")
        return {"format": "tiny_dit", "path": str(out / "model.safetensors")}
    from digenrl.models.registry import family_policy_class

    try:
        family = family_policy_class(cfg.model.kind)
    except ValueError as e:
        raise ArtifactError(f"{run_dir}: {e}") from None
    if family is None:
        raise ArtifactError(f"{run_dir}: model.kind {cfg.model.kind!r} has no diffusers export")
    if fmt == "auto":
        fmt = "lora" if cfg.model.lora.enabled else "full"
    if fmt == "lora" and not cfg.model.lora.enabled:
        raise ArtifactError("export --format lora: the run fine-tuned all weights (model.lora.enabled is false); use --format full")
    transformer = load_trained_transformer(cfg, ckpt)
    out.mkdir(parents=True, exist_ok=True)
    if fmt == "lora":
        save_lora_dir(transformer, family.pipeline_class(), out)
        return {"format": "lora", "path": str(out / LORA_FILE), "base": cfg.model.path}
    if cfg.model.lora.enabled:  # merge W' = W + scale * B A, then drop the adapter modules
        transformer.fuse_lora(lora_scale=1.0)
        transformer.unload_lora()
    transformer.save_pretrained(str(out), safe_serialization=True)
    return {"format": "full", "path": str(out), "base": cfg.model.path}


def apply_checkpoint(policy, path: str | Path) -> str:
    """Load trained weights into ``policy`` (built from the base model); returns what was loaded."""
    p = Path(path).expanduser()
    if p.is_dir():
        if (p / CHECKPOINT).is_file():
            p = p / CHECKPOINT
        elif (p / LORA_FILE).is_file():
            return _apply_adapter(policy, p)
        elif (p / "config.json").is_file():
            return _apply_transformer_dir(policy, p)
        else:
            raise ArtifactError(f"--checkpoint {str(p)!r}: no {CHECKPOINT}, {LORA_FILE} or transformer config.json in it")
    if not p.is_file():
        raise ArtifactError(f"--checkpoint {str(p)!r} does not exist")
    if p.name == LORA_FILE:
        return _apply_adapter(policy, p.parent)
    state = _load_safetensors(p)
    if not hasattr(policy, "transformer"):  # the tiny demo model: a whole state dict
        try:
            policy.load_state_dict(state)
        except RuntimeError as e:
            raise ArtifactError(f"--checkpoint {str(p)!r} does not fit the {type(policy).__name__}: {e}") from None
        return f"checkpoint {p}"
    params = dict(policy.named_parameters())
    hint = " (an exported LoRA? pass its directory)" if any("lora" in k for k in state if k not in params) else ""
    copy_tensors(params, state, lambda problem: ArtifactError(
        f"--checkpoint {str(p)!r} {problem}; use the run's model settings (model.path, model.lora){hint}"))
    return f"checkpoint {p} ({len(state)} tensors)"


def _apply_adapter(policy, directory: Path) -> str:
    pipe = getattr(policy, "_pipe", None)
    if pipe is None or not hasattr(pipe, "load_lora_weights"):
        raise ArtifactError(f"--checkpoint {str(directory)!r} is a LoRA adapter; model.kind has no diffusers pipeline")
    from digenrl.models.lora import has_lora

    if has_lora(policy.transformer):
        raise ArtifactError(f"--checkpoint {str(directory)!r} is an exported LoRA: load it on the base model "
                            "(model.lora.enabled=false)")  # fmt: skip
    pipe.load_lora_weights(str(directory), adapter_name="trained")
    policy.transformer.requires_grad_(False)
    return f"LoRA adapter {directory / LORA_FILE}"


def _apply_transformer_dir(policy, directory: Path) -> str:
    if not hasattr(policy, "transformer"):
        raise ArtifactError(f"--checkpoint {str(directory)!r} is a diffusers transformer; model.kind has none")
    trained = type(policy.transformer).from_pretrained(str(directory), local_files_only=True)
    try:
        policy.transformer.load_state_dict(trained.state_dict())
    except RuntimeError as e:
        raise ArtifactError(f"--checkpoint {str(directory)!r} does not fit the base transformer: {e}") from None
    return f"transformer {directory}"


def main(argv: list[str] | None = None) -> int:
    """``digenrl export RUN_DIR --out DIR [--format auto|lora|full]``."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="digenrl export", description="Export a finished run's trained weights: a LoRA run as diffusers LoRA weights (load_lora_weights), a full fine-tune (or --format full) as a transformer directory.")
    ap.add_argument("run_dir", help="a finished run directory (config.yaml + checkpoint.safetensors)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--format", choices=["auto", "lora", "full"], default="auto",
                    help="lora: diffusers load_lora_weights; full: transformer from_pretrained (LoRA merged)")
    args = ap.parse_args(argv)
    from digenrl.models.diffusers_files import ModelFilesError

    try:
        info = export_run(args.run_dir, args.out, args.format)
    except (ArtifactError, ModelFilesError) as e:
        print(f"digenrl export: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(info))
    return 0
