"""Typed run configuration: YAML file + dotted ``key=value`` overrides, validated by pydantic.

Every table forbids unknown keys, so a typo is refused with the offending dotted key and the expected type
(``ConfigError``; the CLI turns it into exit code 2 before anything is written). One module per section
(``model``, ``train``, ``runtime``, ``tuning``: planner outputs and expert knobs, ``run``: the root ``Config`` with
the cross-key rules), the reader in ``load`` (an old config's moved keys are read in their new homes); a field's
docstring is its documentation (``scripts/config_doc.py``).
"""

from digenrl.models.specs import SEQUENCE_PARALLEL_FAMILIES

from .base import ConfigError
from .load import MAX_CONFIG_BYTES, MOVED, dump_config, load_config, move_old_keys, safe_yaml_load
from .model import LoraConfig, ModelConfig, SamplerConfig, SequenceParallelConfig, TaskConfig
from .run import Config, EvalConfig, LogConfig
from .runtime import CalibrationOptions, GeneratorConfig, RuntimeConfig
from .train import TrainConfig
from .tuning import BTSOptions, TuningConfig

__all__ = ["BTSOptions", "CalibrationOptions", "Config", "ConfigError", "EvalConfig", "GeneratorConfig", "LogConfig",
           "LoraConfig", "MAX_CONFIG_BYTES", "MOVED", "ModelConfig", "RuntimeConfig", "SEQUENCE_PARALLEL_FAMILIES",
           "SamplerConfig", "SequenceParallelConfig", "TaskConfig", "TrainConfig", "TuningConfig", "dump_config",
           "load_config", "move_old_keys", "safe_yaml_load"]
