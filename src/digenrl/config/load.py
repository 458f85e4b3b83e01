"""The config's YAML, in one place: reading a config (a YAML file or a preset, plus dotted ``key=value`` overrides,
validated, with one-line errors), writing one back, and the alias-free YAML reader other files use too.

Keys that moved keep loading: ``MOVED`` is the one table of old key -> new key; ``move_old_keys`` reads a config
tree's old keys into their new homes (a notice per key on stderr, ``runtime.stale_hold is now tuning.stale_hold
(read as such)``) and refuses a tree that sets both names of a key (``ConfigError`` naming both).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from .base import ConfigError
from .run import Config


class _NoAliasLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses aliases (``*name``) while composing, before anything is expanded: a few
    hundred bytes of nested aliases (an alias bomb) would otherwise become 10^9 leaves during validation."""

    def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, f"YAML alias *{event.anchor} is not allowed in a config "
                                              "(write the value out)", event.start_mark)
        return super().compose_node(parent, index)


class _NoAliasDumper(yaml.SafeDumper):
    """Writes an object seen twice out twice, never as an anchor + alias (so this program reads its own files)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


MAX_CONFIG_BYTES = 1 << 20  # a run config is a few KiB; a bigger file is not one

# old dotted key -> its new home (a table moves with every key under it): the planner's outputs and the expert
# knobs left the user's sections for ``tuning`` (issue 37)
MOVED = {"runtime.stale_hold": "tuning.stale_hold", "runtime.gang_groups": "tuning.gang_groups",
         "runtime.tag_inference_copy": "tuning.tag_inference_copy",
         "runtime.calibration.repeats": "tuning.calibration_repeats",
         "train.loss_scale_init": "tuning.loss_scale_init", "runtime.bts": "tuning.bts"}


def safe_yaml_load(text: str) -> Any:
    """``yaml.safe_load`` without aliases; raises ``yaml.YAMLError`` (its message names the line)."""
    return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 (a SafeLoader subclass)


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        nxt = node.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{dotted}: {k!r} is not a table")
        node = nxt
    node[keys[-1]] = value


def _find(tree: Any, dotted: str) -> tuple[bool, Any]:
    """(found, value) of ``dotted`` in ``tree`` (not found where a table on the way is missing or no table)."""
    for k in dotted.split("."):
        if not isinstance(tree, dict) or k not in tree:
            return False, None
        tree = tree[k]
    return True, tree


def _under(key: str, table: str) -> bool:
    """Whether dotted ``key`` is ``table`` or a key under it."""
    return key == table or key.startswith(table + ".")


def _moved_to(key: str) -> str | None:
    """The new home of dotted ``key`` when it is (under) a moved key, else None."""
    return next((new + key[len(old):] for old, new in MOVED.items() if _under(key, old)), None)


def _both(old: str, new: str, who: str) -> ConfigError:
    """The refusal of a config (``who``: "config file '...' sets") that sets the old key ``old`` and ``new``, its
    new home or a key in or around it."""
    return ConfigError(f"{old} and {new}: {who} both ({old} is the old name of {_moved_to(old)}); keep {new}")


def move_old_keys(tree: dict[str, Any], where: str = "the config") -> list[str]:
    """Move every key of ``MOVED`` found in ``tree`` (in place) to its new home; the notices, one per moved key.
    Raises ``ConfigError`` naming both keys where ``tree`` sets an old key and its new one."""
    notes: list[str] = []

    def put(old: str, new: str, value: Any) -> None:
        if isinstance(value, dict) and value:  # a table: key by key (runtime.bts.depth -> tuning.bts.depth)
            for k, v in value.items():
                put(f"{old}.{k}", f"{new}.{k}", v)
            return
        if _find(tree, new)[0]:
            raise _both(old, new, f"{where} sets")
        _set_dotted(tree, new, value)
        notes.append(f"{old} is now {new} (read as such)")

    for old, new in MOVED.items():
        found, value = _find(tree, old)
        if found:
            parent, _, last = old.rpartition(".")
            del _find(tree, parent)[1][last]
            put(old, new, value)
    return notes


def _fields_at(loc: tuple) -> list[str]:
    """The keys of the config table at ``loc`` (a pydantic error location), or [] where it is not a table."""
    model: Any = Config
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return []
        model = field.annotation
    return list(model.model_fields)


def _error_line(e: dict) -> str:
    """One pydantic error as ``key: what is wrong; what to do``."""
    loc = tuple(e["loc"])
    key = ".".join(str(p) for p in loc) or "<root>"
    if e["type"] == "extra_forbidden":
        from digenrl.model_options import did_you_mean

        fields = _fields_at(loc[:-1])
        parent = ".".join(str(p) for p in loc[:-1])
        hint = did_you_mean(str(loc[-1]), fields, parent + "." if parent else "")
        return f"{key}: unknown key{hint}" + ("" if hint or not fields else f" ({parent or 'top level'} keys: "
                                                                          f"{', '.join(fields)})")
    if e["type"] == "value_error":  # a validator's own message: it names its key and what to do
        msg = str(e.get("ctx", {}).get("error", e["msg"]))
        head = msg.split(":", 1)[0]
        if "." in head and " " not in head or not loc:
            return msg
        return f"{key}: {msg}"
    got = repr(e.get("input"))
    return f"{key}: {e['msg']} (got {got if len(got) <= 80 else got[:77] + '...'})"


def _format_validation(err: ValidationError) -> str:
    """One line for one error (``train.lrr: unknown key; did you mean train.lr?``), else a list."""
    lines = [_error_line(e) for e in err.errors()]
    return lines[0] if len(lines) == 1 else "invalid configuration:\n  " + "\n  ".join(lines)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load YAML ``path`` (optional), apply ``key=value`` overrides (values parsed as YAML), validate."""
    tree: dict[str, Any] = {}
    if path is not None:
        from digenrl.presets import PREFIX, preset_path

        try:  # --config preset:flux1_dev: the shipped preset of that name
            p = preset_path(path[len(PREFIX):]) if isinstance(path, str) and path.startswith(PREFIX) else Path(path)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        if p.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"config file {str(p)!r} is {p.stat().st_size} bytes (at most {MAX_CONFIG_BYTES})")
        try:
            loaded = safe_yaml_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {str(p)!r} is not valid YAML: {e}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(p)!r} must contain a mapping at top level")
        tree = loaded
        _notify(move_old_keys(tree, f"config file {str(p)!r}"))
    given: dict[str, str] = {}  # an override's target key -> the key it was given as (an old one: not the target)
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value (e.g. train.lr=1e-4)")
        key, raw = item.split("=", 1)
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r} has an empty key")
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(f"override {key!r}: its value is {len(raw)} characters (at most {MAX_CONFIG_BYTES})")
        try:
            value = safe_yaml_load(raw) if raw != "" else ""
        except yaml.composer.ComposerError as e:  # an alias: refused, not taken as a string
            raise ConfigError(f"override {key!r}: {e}") from None
        except yaml.YAMLError:
            value = raw
        key = key.strip()
        target = _moved_to(key) or key  # an old key and its new one (or a table around it) given: refused
        for t, k in given.items():
            if (k != t) != (key != target) and (_under(t, target) or _under(target, t)):
                raise _both(k, key, "the overrides set") if k != t else _both(key, k, "the overrides set")
        if target != key:
            _notify([f"{key} is now {target} (read as such)"])
        given[target] = key
        _set_dotted(tree, target, value)
    _notify(move_old_keys(tree, "the config with its overrides"))  # an override setting a table with an old key
    try:
        return Config.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_format_validation(e)) from None


def _notify(notes: list[str]) -> None:
    for line in notes:
        print(line, file=sys.stderr)


def dump_config(cfg: Config, path: str | Path | None = None) -> str:
    """``cfg`` as YAML (every key, in schema order), written to ``path`` when given."""
    text = yaml.dump(cfg.model_dump(mode="json"), Dumper=_NoAliasDumper, sort_keys=False)
    if path is not None:
        Path(path).write_text(text)
    return text
