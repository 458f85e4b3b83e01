"""Typed run configuration: YAML file + dotted ``key=value`` overrides, validated by pydantic. This module: the
strict base model, ``ConfigError`` and the YAML reader every section shares.

Every table forbids unknown keys, so a typo is refused with the offending dotted key and the expected type
(``ConfigError``; the CLI turns it into exit code 2 before anything is written).
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A configuration problem; the message names the key (or file) and what was expected."""


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


def safe_yaml_load(text: str) -> Any:
    """``yaml.safe_load`` without aliases; raises ``yaml.YAMLError`` (its message names the line)."""
    return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 (a SafeLoader subclass)


class _Strict(BaseModel):
    # every float must be finite: an inf lr / noise level or a NaN max_grad_norm would train every weight to NaN
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False,
                              use_attribute_docstrings=True)  # a field's docstring is its description (docs)


# An expert knob or a planner output (``digenrl plan`` writes it): documented apart from the keys a user sets
# (docs/configuration.md, "Planner outputs and expert knobs"); ``Field(..., json_schema_extra=EXPERT)``.
EXPERT = {"expert": True}
