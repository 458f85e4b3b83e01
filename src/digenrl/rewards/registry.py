"""Reward registry and plug-ins: find a reward's factory, validate its typed options, build the weighted sum.

The config's ``reward`` table maps a name to options (``{weight: 0.5, threshold: 0.3}``; docs/rewards.md has
examples). A name is resolved, in this order, as: the ``factory`` option (``"module:attr"``); a name containing
``:``; a built-in (``BUILTIN``); a peer's name for a built-in (``ALIASES``); an installed entry point of group
``digenrl.rewards`` (``ep.load()`` gives the factory). ``weight`` (default 1.0) and ``factory`` are reserved;
every other key is an option of the factory, validated before anything is built against the factory's
``options_model`` (a pydantic model) if it declares one, else its signature: each keyword parameter's
annotation is its type, one without default is required, and a key the factory does not take is refused naming
it (unless it takes ``**kwargs``). A factory's optional ``check(**options)`` checks what can be checked without
loading anything (files exist, URLs and patterns are well formed, packages are installed) and raises
``ValueError`` / ``OSError``. ``validate_reward_spec`` runs only the checks, so the CLI can refuse bad input
before writing anything; a factory returns a ``RewardFn`` (``rewards.base``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import math
import typing
from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from digenrl.rewards.base import RewardFn, WeightedSum

ENTRY_POINT_GROUP = "digenrl.rewards"
RESERVED = ("weight", "factory")

BUILTIN: dict[str, str] = {
    "digits": "digenrl.rewards.digits:DigitsReward",
    "jpeg_compressibility": "digenrl.rewards.jpeg:build_jpeg_compressibility",
    "jpeg_incompressibility": "digenrl.rewards.jpeg:build_jpeg_incompressibility",
    "clipscore": "digenrl.rewards.clip_based:ClipScore",
    "pickscore": "digenrl.rewards.clip_based:PickScore",
    "aesthetic": "digenrl.rewards.clip_based:AestheticScore",
    "hpsv2": "digenrl.rewards.hpsv2:HpsV2",
    "image_reward": "digenrl.rewards.image_reward:ImageReward",
    "ocr": "digenrl.rewards.ocr:OcrReward",
    "vlm_judge": "digenrl.rewards.vlm_judge:VlmJudge",
    "geneval": "digenrl.rewards.geneval:GenEvalReward",
    "remote": "digenrl.rewards.client:build_remote_reward",
}


# Names other trainers use for the same rewards (Flow-GRPO ``flow_grpo/rewards.py`` ``multi_score``): the name
# stays the table's key (metrics ``reward/<name>``), the factory is the built-in's; the alias's defaults are
# laid under the given options (Flow-GRPO's UnifiedReward server and model: its ``unifiedreward_score_sglang``).
ALIASES: dict[str, tuple[str, dict[str, Any]]] = {
    "imagereward": ("image_reward", {}),
    "clip_score": ("clipscore", {}),  # the spelling of earlier docs; `clipscore` is the canonical name
    "unifiedreward": ("vlm_judge", {"base_url": "http://127.0.0.1:17140/v1", "model": "UnifiedReward-7b-v1.5"}),
}
# Peer rewards with no DigenRL counterpart: refused with what they are, not as an unknown name.
NOT_SHIPPED: dict[str, str] = {
    "deqa": "Flow-GRPO's DeQA-Score (a remote LLaVA quality server)",
    "qwenvl": "Flow-GRPO's local Qwen2-VL scorer (serve a VLM and use vlm_judge)",
    "seedscore": "Flow-GRPO's Seed-VL scorer",
    "video_ocr": "Flow-GRPO's per-frame video OCR",
    "image_similarity": "Flow-GRPO's CLIP similarity to reference images",
}


class RewardConfigError(ValueError):
    """A reward name or option that cannot be used; the message names ``reward.<name>[.<option>]``."""


@dataclass(frozen=True)
class RewardSpec:
    """One validated entry of the ``reward`` table."""

    name: str
    weight: float
    factory: Callable[..., RewardFn]
    options: dict[str, Any]
    origin: str  # "builtin:<target>", "entry_point:<value>" or "path:<module:attr>"


def reward_names() -> list[str]:
    """Built-in names, their aliases and installed entry points."""
    return sorted(set(BUILTIN) | set(ALIASES) | {ep.name for ep in _entry_points()})


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def load_target(target: str, where: str) -> Callable[..., Any]:
    """``"pkg.module:attr[.attr]"`` -> the object; errors name ``where`` and the target."""
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise RewardConfigError(f"{where}: factory {target!r} must look like 'package.module:function'")
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as e:
        raise RewardConfigError(f"{where}: cannot import module {module!r} of factory {target!r}: {e}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise RewardConfigError(f"{where}: module {module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise RewardConfigError(f"{where}: factory {target!r} is not callable")
    return obj


def resolve_factory(name: str, factory: str | None = None) -> tuple[Callable[..., RewardFn], str]:
    """The factory of reward ``name`` and where it came from (see the module docstring for the order)."""
    where = f"reward.{name}"
    if factory is not None:
        if not isinstance(factory, str):
            raise RewardConfigError(f"{where}.factory: expected a 'module:function' string, got {factory!r}")
        return load_target(factory, f"{where}.factory"), f"path:{factory}"
    if ":" in name:
        return load_target(name, where), f"path:{name}"
    if name in BUILTIN:
        return load_target(BUILTIN[name], where), f"builtin:{BUILTIN[name]}"
    if name in ALIASES:
        target = BUILTIN[ALIASES[name][0]]
        return load_target(target, where), f"alias:{ALIASES[name][0]}:{target}"
    matches = [ep for ep in _entry_points() if ep.name == name]
    if matches:
        try:
            return matches[0].load(), f"entry_point:{matches[0].value}"
        except Exception as e:  # a broken plug-in is bad input, not a crash
            raise RewardConfigError(f"{where}: entry point {matches[0].value!r} failed to load: {e!r}") from None
    if name in NOT_SHIPPED:
        raise RewardConfigError(f"{where}: {NOT_SHIPPED[name]} is not a DigenRL reward; write it as a plug-in "
                                f"(a 'module:function' factory, docs/rewards.md) or use one of {reward_names()}")
    from digenrl.model_options import did_you_mean

    raise RewardConfigError(
        f"reward.{str(name)[:60]}: unknown reward{did_you_mean(str(name), reward_names(), 'reward.') or '.'} Use a "
        f"built-in ({', '.join(sorted(BUILTIN))}), an entry point of group {ENTRY_POINT_GROUP!r}, or a "
        f"'module:function' factory (docs/rewards.md)"
    )


def options_model(factory: Callable[..., Any]) -> type[BaseModel]:
    """A pydantic model of ``factory``'s keyword options (``factory.options_model`` if it declares one)."""
    declared = getattr(factory, "options_model", None)
    if isinstance(declared, type) and issubclass(declared, BaseModel):
        return declared
    fn = factory.__init__ if isinstance(factory, type) else factory
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable annotations: accept any value for those parameters
        hints = {}
    params = inspect.signature(factory).parameters.values()
    fields = {p.name: (hints.get(p.name, Any), ... if p.default is p.empty else p.default) for p in params
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}  # fmt: skip
    extra = "allow" if any(p.kind is p.VAR_KEYWORD for p in params) else "forbid"
    cfg = ConfigDict(extra=extra, arbitrary_types_allowed=True, protected_namespaces=())
    return create_model(f"{getattr(factory, '__name__', 'reward')}_options", __config__=cfg, **fields)


def _check_options(name: str, factory: Callable[..., Any], options: dict[str, Any]) -> dict[str, Any]:
    model = options_model(factory)
    try:
        validated = model.model_validate(options)
    except ValidationError as e:
        known = sorted(model.model_fields)
        lines = []
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"])
            if err["type"] == "extra_forbidden":
                from digenrl.model_options import did_you_mean

                hint = did_you_mean(key, known + list(RESERVED), f"reward.{name}.")
                lines.append(f"reward.{name}.{key}: unknown option{hint} (options of {name!r}: "
                             f"{', '.join(known + list(RESERVED))})")
            elif err["type"] == "missing":
                lines.append(f"reward.{name}.{key}: required option is missing")
            else:
                lines.append(f"reward.{name}.{key}: {err['msg']} (got {_short(err.get('input'))})")
        raise RewardConfigError("; ".join(lines)) from None
    typed = dict(validated)  # the fields and the extras
    checked = {k: typed[k] for k in options}
    check = getattr(factory, "check", None)
    if callable(check):
        try:
            check(**checked)
        except (ValueError, OSError, TypeError) as e:
            msg = f"reward.{name}: {str(e).strip(chr(39) + chr(34))}"
            if isinstance(e, FileNotFoundError):  # keeps its type: a missing weights file
                raise FileNotFoundError(msg) from None
            raise RewardConfigError(msg) from None
    return checked


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_reward_spec(spec: dict[str, dict[str, Any]]) -> list[RewardSpec]:
    """Validate the whole ``reward`` table (names, weights, typed options) without building anything."""
    if not isinstance(spec, dict) or not spec:
        raise RewardConfigError("reward: at least one reward is required (a table name -> options)")
    out = []
    for name, opts in spec.items():
        if opts is None:
            opts = {}
        if isinstance(opts, (int, float)) and not isinstance(opts, bool):  # {pickscore: 0.5}: the weight
            opts = {"weight": opts}
        if not isinstance(opts, dict):
            raise RewardConfigError(f"reward.{name}: expected a table of options, got {_short(opts)}")
        opts = dict(opts)
        weight = opts.pop("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise RewardConfigError(f"reward.{name}.weight: expected a number, got {_short(weight)}")
        if not math.isfinite(weight):  # a NaN or infinite weight makes every reward, then every weight, NaN
            raise RewardConfigError(f"reward.{name}.weight: expected a finite number, got {weight}")
        factory, origin = resolve_factory(str(name), opts.pop("factory", None))
        if origin.startswith("alias:"):
            opts = {**ALIASES[str(name)][1], **opts}
        out.append(RewardSpec(str(name), float(weight), factory, _check_options(str(name), factory, opts), origin))
    return out


def validate_reward_spec(spec: dict[str, dict[str, Any]]) -> None:
    """Raise ``RewardConfigError`` (``FileNotFoundError`` for missing weights) naming the first bad reward
    name / option; nothing is built."""
    parse_reward_spec(spec)


def build_reward(name: str, **options: Any) -> RewardFn:
    (rs,) = parse_reward_spec({name: options})
    return rs.factory(**rs.options)


def build_weighted(spec: dict[str, dict[str, Any]]) -> WeightedSum:
    """``spec`` = {name: {"weight": w, **options}} -> WeightedSum (validated first, then built)."""
    specs = parse_reward_spec(spec)
    return WeightedSum({rs.name: (rs.weight, rs.factory(**rs.options)) for rs in specs})
