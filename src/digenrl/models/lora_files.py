"""LoRA adapters from files (``model.lora_path``): the adapter a run trains on, as another trainer saved it.

Accepted (a file, or a directory holding one):

* PEFT (Flow-GRPO's checkpoints: ``PeftModel.save_pretrained`` of ``get_peft_model(transformer, LoraConfig)``,
  in ``<logdir>/checkpoints/checkpoint-N/lora/``): ``adapter_model.safetensors`` with keys
  ``base_model.model.<module>.lora_{A,B}.weight`` and ``adapter_config.json`` (``r``, ``lora_alpha``,
  ``target_modules``, ``lora_dropout``). A checkpoint directory with a ``lora/`` subfolder is accepted too.
* diffusers (``Pipeline.save_lora_weights``, ``digenrl export``): ``pytorch_lora_weights.safetensors`` with keys
  ``transformer.<module>.lora_{A,B}.weight`` and, when saved with it, the adapter config as metadata
  (``lora_adapter_metadata``); without it the rank comes from the shapes and alpha = rank (diffusers' default).

``resolve_lora(model_cfg)`` sets ``model.lora`` from the adapter (enabled, rank, alpha, targets, dropout): a run's
config.yaml records the adapter's settings, and a ``model.lora`` value set by hand that disagrees is refused
naming the key. ``load_adapter(policy, path)`` copies the tensors into the policy built with those settings;
every adapter tensor must meet a LoRA parameter of the policy and every LoRA parameter a tensor. Refused, with
the file named: DoRA / rsLoRA / per-module rank or alpha patterns / ``modules_to_save``, ranks that differ between
modules, tensors that are not PEFT/diffusers LoRA tensors (e.g. kohya ``lora_down``), pickled ``.bin`` files.
Only headers and the small JSON file are read by ``resolve_lora``; the tensors by ``load_adapter``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

PEFT_FILE = "adapter_model.safetensors"
PEFT_CONFIG = "adapter_config.json"
DIFFUSERS_FILE = "pytorch_lora_weights.safetensors"
METADATA_KEY = "lora_adapter_metadata"
_PREFIXES = ("base_model.model.", "transformer.")
_KEY = "model.lora_path"


class AdapterError(ValueError):
    """An adapter that cannot be used; the message names ``model.lora_path`` (or the ``model.lora`` key)."""


@dataclass(frozen=True)
class AdapterInfo:
    file: Path
    fmt: str  # "peft" or "diffusers"
    rank: int
    alpha: float
    dropout: float | None
    targets: list[str]
    keys: dict[str, str]  # file key -> "<module>.lora_A.weight" / "<module>.lora_B.weight"


def adapter_file(path: str | Path) -> tuple[Path, str]:
    """(the adapter's weights file, "peft" | "diffusers") of ``path`` (a file or a directory)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise AdapterError(f"{_KEY}: {str(p)!r} does not exist")
    if p.is_dir():
        for d in (p, p / "lora"):
            if (d / PEFT_FILE).is_file():
                return d / PEFT_FILE, "peft"
            if (d / DIFFUSERS_FILE).is_file():
                return d / DIFFUSERS_FILE, "diffusers"
        bins = [f.name for f in p.glob("*.bin")]
        hint = f" ({bins[0]} is a pickle: save it as safetensors)" if bins else ""
        raise AdapterError(f"{_KEY}: {str(p)!r} holds no {PEFT_FILE} or {DIFFUSERS_FILE} (nor lora/ with one){hint}")
    if p.suffix != ".safetensors":
        raise AdapterError(f"{_KEY}: {str(p)!r} is not a .safetensors adapter (PEFT {PEFT_FILE} or diffusers {DIFFUSERS_FILE})")
    return p, "peft" if (p.parent / PEFT_CONFIG).is_file() and p.name != DIFFUSERS_FILE else "diffusers"


def _module_key(key: str, file: Path) -> str:
    k = key
    for pre in _PREFIXES:
        if k.startswith(pre):
            k = k[len(pre) :]
            break
    k = k.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")
    if not (k.endswith(".lora_A.weight") or k.endswith(".lora_B.weight")):
        raise AdapterError(f"{_KEY}: {str(file)!r} holds {key!r}, not a PEFT / diffusers LoRA tensor "
                           "(<module>.lora_A.weight / lora_B.weight); kohya-style lora_down/lora_up files are not read")
    return k


def read_adapter(path: str | Path) -> AdapterInfo:
    """The adapter's settings and key map from its header and config (no tensor is loaded)."""
    from digenrl.safe_files import safetensors_header

    file, fmt = adapter_file(path)
    try:
        header = safetensors_header(file)
    except ValueError as e:
        raise AdapterError(f"{_KEY}: {e}") from None
    meta = header.get("__metadata__") or {}
    names = [k for k in header if k != "__metadata__"]
    if not names:
        raise AdapterError(f"{_KEY}: {str(file)!r} holds no tensors")
    keys = {k: _module_key(k, file) for k in names}
    ranks = {header[k]["shape"][0] for k, m in keys.items() if m.endswith(".lora_A.weight")}
    if not ranks:
        raise AdapterError(f"{_KEY}: {str(file)!r} holds no lora_A tensors")
    conf: dict = {}
    if fmt == "peft" and (file.parent / PEFT_CONFIG).is_file():
        try:
            conf = json.loads((file.parent / PEFT_CONFIG).read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise AdapterError(f"{_KEY}: {str(file.parent / PEFT_CONFIG)!r} is not valid JSON ({e})") from None
    elif METADATA_KEY in meta:
        try:
            packed = json.loads(meta[METADATA_KEY])
        except json.JSONDecodeError as e:
            raise AdapterError(f"{_KEY}: {str(file)!r}: its {METADATA_KEY} is not valid JSON ({e})") from None
        conf = {k.split(".", 1)[1]: v for k, v in packed.items() if k.startswith("transformer.")} or packed
    where = str(file.parent / PEFT_CONFIG) if fmt == "peft" and conf else str(file)
    for flag in ("use_dora", "use_rslora"):
        if conf.get(flag):
            raise AdapterError(f"{_KEY}: {where!r} sets {flag}; DigenRL trains plain LoRA (W + alpha/r B A)")
    for pattern in ("rank_pattern", "alpha_pattern"):
        if conf.get(pattern):
            raise AdapterError(f"{_KEY}: {where!r} sets {pattern} (per-module ranks / alphas); one rank and alpha only")
    if conf.get("modules_to_save"):
        raise AdapterError(f"{_KEY}: {where!r} trains whole modules too (modules_to_save={conf['modules_to_save']})")
    if len(ranks) > 1:
        raise AdapterError(f"{_KEY}: {str(file)!r} has modules of different ranks {sorted(ranks)}; one rank only")
    rank = int(conf.get("r", next(iter(ranks))))
    if rank != next(iter(ranks)):
        raise AdapterError(f"{_KEY}: {where!r} says r={rank}, its tensors have rank {next(iter(ranks))}")
    modules = sorted({m.rsplit(".lora_", 1)[0] for m in keys.values()})
    targets = conf.get("target_modules")
    targets = sorted(targets) if isinstance(targets, list) and targets else modules  # a regex string: exact names
    alpha = float(conf.get("lora_alpha", rank))
    dropout = conf.get("lora_dropout")
    return AdapterInfo(file, fmt, rank, alpha, None if dropout is None else float(dropout), targets, keys)


def resolve_lora(model_cfg):
    """``model_cfg`` with ``model.lora`` set from the adapter of ``model.lora_path`` (unchanged without one)."""
    if not getattr(model_cfg, "lora_path", None):
        return model_cfg
    if model_cfg.kind == "tiny_dit":
        raise AdapterError(f"{_KEY}: model.kind=tiny_dit has no LoRA (it trains all weights); a diffusers family loads adapters")
    info = read_adapter(model_cfg.lora_path)
    lora = model_cfg.lora
    given = lora.model_fields_set
    if "enabled" in given and not lora.enabled:
        raise AdapterError("model.lora.enabled: false, but model.lora_path gives an adapter to train on; drop one")
    want = {"rank": info.rank, "alpha": info.alpha, "target_modules": info.targets}
    if info.dropout is not None:
        want["dropout"] = info.dropout
    for key, value in want.items():
        have = getattr(lora, key)
        same = sorted(have) == value if key == "target_modules" and have is not None else have == value
        if key in given and have is not None and not same:
            name = {"rank": "r", "alpha": "lora_alpha", "target_modules": "target_modules", "dropout": "lora_dropout"}[key]
            raise AdapterError(f"model.lora.{key}: {have} set, but the adapter {str(info.file)!r} has {name}={value}; "
                               f"drop model.lora.{key} (model.lora_path sets it)")
    new_lora = lora.model_copy(update={"enabled": True, **want})
    return model_cfg.model_copy(update={"lora": new_lora})


def load_adapter(policy, path: str | Path) -> str:
    """Copy the adapter's tensors into ``policy``'s LoRA parameters (built from ``resolve_lora``'s settings)."""
    from safetensors.torch import load_file

    from digenrl.models.base import copy_tensors

    info = read_adapter(path)
    state = load_file(str(info.file))
    params = {n: p for n, p in policy.named_parameters() if ".lora_A." in n or ".lora_B." in n}
    prefix = "transformer." if any(n.startswith("transformer.") for n in params) else ""
    wanted = {}
    for key, module_key in info.keys.items():  # "<module>.lora_A.weight" -> "<module>.lora_A.default.weight"
        module, _, kind = module_key.rpartition(".lora_")
        wanted[f"{prefix}{module}.lora_{kind.split('.')[0]}.default.weight"] = state[key]
    copy_tensors(params, wanted, lambda problem: AdapterError(
        f"{_KEY}: {str(info.file)!r} {problem} (LoRA targets {info.targets[:4]}); is it for another model.kind / "
        "model.path?"), required=params)  # fmt: skip
    return f"LoRA adapter {info.file} ({info.fmt}, r={info.rank}, alpha={info.alpha:g}, {len(wanted)} tensors)"
