"""The strict base model every config section shares (unknown keys refused: the package docstring) and
``ConfigError``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A configuration problem; the message names the key (or file) and what was expected."""


class _Strict(BaseModel):
    # every float must be finite: an inf lr / noise level or a NaN max_grad_norm would train every weight to NaN
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False,
                              use_attribute_docstrings=True)  # a field's docstring is its description (docs)

