"""Local diffusers model directories: checking the layout, loading the pipeline offline, family sigmas.

A diffusers model directory has the standard layout::

    model_index.json            # pipeline class and component classes
    transformer/config.json + *.safetensors
    vae/config.json + *.safetensors
    scheduler/scheduler_config.json
    text_encoder*/ tokenizer*/  # optional when a precomputed prompt cache is used

Nothing is fetched from the network: every load passes ``local_files_only=True``. A missing directory or
component is a ``ModelFilesError`` naming the directory and each missing file or subfolder.

Sigma schedules follow the family pipeline's ``FlowMatchEulerDiscreteScheduler.set_timesteps`` call (through
``digenrl.algo.sigmas.flow_match_sigmas``): a static ``shift``, or the resolution-dependent ``mu`` when the
scheduler config has ``use_dynamic_shifting``; ``grid="linear"`` for pipelines that pass
``sigmas = linspace(1, 1/N, N)`` themselves (FLUX, Qwen-Image, HunyuanVideo). ``shift_terminal`` (Qwen-Image)
stretches the schedule so its last non-zero sigma equals ``shift_terminal``::

    sigma' = 1 - (1 - sigma) / ((1 - sigma_last) / (1 - shift_terminal))
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import torch

from digenrl.algo.sigmas import flow_match_sigmas, resolution_shift_mu

_WEIGHT_SUFFIXES = (".safetensors", ".bin")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelFilesError(ValueError):
    """A model directory is missing or incomplete; the message names the path and what is missing."""


def _component_problems(root: Path, name: str, kind: str) -> list[str]:
    sub = root / name
    if not sub.is_dir():
        return [f"{name}/ (subfolder)"]
    if kind == "scheduler":
        return [] if (sub / "scheduler_config.json").is_file() else [f"{name}/scheduler_config.json"]
    if kind == "tokenizer":
        names = {p.name for p in sub.iterdir()}
        ok = any(n in names for n in ("tokenizer.json", "vocab.json", "spiece.model", "tokenizer.model"))
        return [] if ok else [f"{name}/tokenizer.json (or vocab.json / spiece.model)"]
    problems = [] if (sub / "config.json").is_file() else [f"{name}/config.json"]
    if not any(p.name.endswith(_WEIGHT_SUFFIXES) for p in sub.iterdir()):
        problems.append(f"{name}/*.safetensors (weights)")
    return problems


def _kind_of(name: str) -> str:
    return "scheduler" if name == "scheduler" else "tokenizer" if name.startswith("tokenizer") else "model"


def check_model_dir(path: str | None, kind: str, required: Sequence[str]) -> dict[str, Any]:
    """Validate ``path`` for policy ``kind``; return its ``model_index.json``. Raises ``ModelFilesError``."""
    if not path:
        raise ModelFilesError(f"model.path: a local diffusers directory is required for model.kind={kind!r}")
    root = Path(path).expanduser()
    if not root.is_dir():
        raise ModelFilesError(f"model.path: diffusers directory {str(root)!r} does not exist")
    index_file = root / "model_index.json"
    problems: list[str] = []
    index: dict[str, Any] = {}
    if not index_file.is_file():
        problems.append("model_index.json")
    else:
        try:
            index = json.loads(index_file.read_text())
        except json.JSONDecodeError as e:
            raise ModelFilesError(f"{str(index_file)!r} is not valid JSON: {e}") from None
    for name in required:
        problems += _component_problems(root, name, _kind_of(name))
    if problems:
        raise ModelFilesError(
            f"model directory {str(root)!r} (model.kind={kind!r}) is incomplete; missing: {', '.join(problems)}"
        )
    return index


def _fits(value: Any, hint: Any, default: Any) -> bool:
    """Does JSON ``value`` fit the scalar annotation ``hint`` (int, float, bool, str, or an Optional / union of
    them)? Anything else (containers, classes) is not checked: True."""
    import types
    import typing

    if value is None and default is None:
        return True
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        members = typing.get_args(hint)
        if not all(m in (int, float, bool, str, type(None)) for m in members):
            return True
        return any(_fits(value, m, default) for m in members)
    if hint is type(None):
        return value is None
    if hint in (int, float):
        return isinstance(value, (int, float))  # (a bool is an int to Python, as to diffusers)
    if hint is bool:
        return isinstance(value, (bool, int))
    if hint is str:
        return isinstance(value, str)
    return True


def transformer_module_names(path: str | Path) -> list[str] | None:
    """The module names of the directory's transformer: its diffusers class built from ``transformer/config.json``
    on the meta device (no weight is read or allocated); None where it cannot be built so (the policy's build
    then reports what is wrong)."""
    try:
        import diffusers

        sub = Path(path).expanduser() / "transformer"
        cls = getattr(diffusers, str(json.loads((sub / "config.json").read_text()).get("_class_name", "")))
        with torch.device("meta"):
            model = cls.from_config(cls.load_config(str(sub)))
    except Exception:  # noqa: BLE001 -- an up-front check only: the same rule runs when the policy builds
        return None
    return [n for n, _ in model.named_modules()]


def check_config_types(path: str | Path, component: str) -> None:
    """``ModelFilesError`` naming the file and the key where a value of ``component``'s config (``config.json``,
    a scheduler's ``scheduler_config.json``) does not fit the scalar type its diffusers class declares for that
    argument (``num_layers: "two"``), so it is refused before any model is built. A class diffusers does not
    know, or arguments without a scalar annotation, are not checked."""
    import inspect
    import typing

    sub = Path(path).expanduser() / component
    f = sub / ("scheduler_config.json" if _kind_of(component) == "scheduler" else "config.json")
    try:
        data = json.loads(f.read_text())
        import diffusers

        cls = getattr(diffusers, str(data.get("_class_name", "")), None) if isinstance(data, dict) else None
        if cls is None:
            return
        hints = typing.get_type_hints(cls.__init__)
        params = inspect.signature(cls.__init__).parameters
    except Exception:  # noqa: BLE001 -- unreadable JSON is reported by its own check; no diffusers: nothing to check
        return
    for key, value in data.items():
        if key.startswith("_") or key not in hints or key not in params:
            continue
        if not _fits(value, hints[key], params[key].default):
            want = getattr(hints[key], "__name__", None) or str(hints[key])
            shown = json.dumps(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            raise ModelFilesError(f"{str(f)!r}: {key} is {shown}, expected {want} ({cls.__name__}); fix the "
                                  f"value in that file")


def present_components(path: str, names: Sequence[str]) -> list[str]:
    """The subset of ``names`` that exist as complete components in ``path``."""
    root = Path(path).expanduser()
    return [n for n in names if not _component_problems(root, n, _kind_of(n))]


def load_pipeline(pipeline_cls, path: str, dtype: str, skip: Sequence[str]):
    """``pipeline_cls.from_pretrained`` offline, with the components in ``skip`` set to ``None``.

    The VAE is loaded in float32 from its own files (decoding precision, as the Flow-GRPO scripts do): never
    loaded in ``dtype`` and upcast, which would keep the rounding of the 16-bit load.
    """
    import diffusers

    torch_dtype = DTYPES[dtype]
    root = Path(path).expanduser()
    extra = {}
    if torch_dtype != torch.float32 and "vae" not in skip and (root / "vae" / "config.json").is_file():
        vae_cls = getattr(diffusers, json.loads((root / "vae" / "config.json").read_text())["_class_name"])
        extra["vae"] = vae_cls.from_pretrained(str(root), subfolder="vae", local_files_only=True, torch_dtype=torch.float32)
    pipe = pipeline_cls.from_pretrained(
        str(root), local_files_only=True, dtype=torch_dtype, **{c: None for c in skip}, **extra
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


_UNSUPPORTED = ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "invert_sigmas")


def family_sigmas(
    scheduler_config: dict[str, Any],
    num_steps: int,
    *,
    grid: str,
    image_seq_len: int | None = None,
    default_max_shift: float = 1.15,
) -> torch.Tensor:
    """``num_steps + 1`` sigmas (1 -> 0) as the family pipeline would set them (see the module docstring).

    A ``UniPCMultistepScheduler`` config with flow sigmas (the Wan2.1 default) is mapped to the Euler
    flow-matching schedule with ``shift = flow_shift``: the sampler is always the (SDE-)Euler step.
    """
    cfg = dict(scheduler_config)
    cls = cfg.get("_class_name", "FlowMatchEulerDiscreteScheduler")
    if cls == "UniPCMultistepScheduler":
        if not cfg.get("use_flow_sigmas", False):
            raise ValueError("scheduler: UniPCMultistepScheduler without use_flow_sigmas is not a flow-matching schedule")
        cfg = {"shift": float(cfg.get("flow_shift", 1.0)), "num_train_timesteps": cfg.get("num_train_timesteps", 1000)}
    elif cls != "FlowMatchEulerDiscreteScheduler":
        raise ValueError(f"scheduler: unsupported scheduler class {cls!r}; expected FlowMatchEulerDiscreteScheduler")
    for flag in _UNSUPPORTED:
        if cfg.get(flag):
            raise ValueError(f"scheduler: {flag}=true is not supported by the flow-matching sampler")
    mu = None
    if cfg.get("use_dynamic_shifting", False):
        if cfg.get("time_shift_type", "exponential") != "exponential":
            raise ValueError(f"scheduler: time_shift_type={cfg['time_shift_type']!r} is not supported")
        if image_seq_len is None:
            raise ValueError("scheduler: use_dynamic_shifting needs the image token count")
        mu = resolution_shift_mu(
            image_seq_len,
            base_seq_len=cfg.get("base_image_seq_len", 256),
            max_seq_len=cfg.get("max_image_seq_len", 4096),
            base_shift=cfg.get("base_shift", 0.5) if cfg.get("base_shift") is not None else 0.5,
            max_shift=cfg.get("max_shift", default_max_shift) if cfg.get("max_shift") is not None else default_max_shift,
        )
    sig = flow_match_sigmas(
        num_steps,
        shift=float(cfg.get("shift", 1.0)),
        mu=mu,
        num_train_timesteps=int(cfg.get("num_train_timesteps", 1000)),
        grid=grid,
    )
    terminal = cfg.get("shift_terminal")
    if terminal and float(sig[-2]) < 1.0:  # (a 1-step schedule has nothing to stretch; diffusers gives NaN)
        one_minus = 1 - sig[:-1]  # the module docstring's stretch, the final 0 kept
        sig = torch.cat([1 - one_minus / (one_minus[-1] / (1 - float(terminal))), sig[-1:]])
    return sig
