"""Typed run configuration: YAML file + dotted ``key=value`` overrides, validated by pydantic.

Every table forbids unknown keys, so a typo is refused with the offending dotted key and the expected type
(``ConfigError``; the CLI turns it into exit code 2 before anything is written). One module per section
(``model``, ``train``, ``runtime``, ``tuning``: planner outputs and expert knobs, ``run``: the root ``Config`` with
the cross-key rules), the reader in ``load`` (an old config's moved keys are read in their new homes); a field's
docstring is its documentation (``scripts/config_doc.py``).
"""

from .base import ConfigError
from .load import MOVED, dump_config, load_config, move_old_keys, safe_yaml_load
from .model import LoraConfig, ModelConfig, TaskConfig
from .run import Config
from .runtime import GeneratorConfig
from .tuning import BTSOptions

__all__ = ["BTSOptions", "Config", "ConfigError", "GeneratorConfig", "LoraConfig", "MOVED", "ModelConfig", "TaskConfig",
           "dump_config", "load_config", "move_old_keys", "safe_yaml_load"]
