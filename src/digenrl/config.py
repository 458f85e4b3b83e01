"""Typed run configuration: YAML file + dotted ``key=value`` overrides, validated by pydantic.

Every table forbids unknown keys, so a typo is refused with the offending dotted key and the expected type
(``ConfigError``; the CLI turns it into exit code 2 before anything is written).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

MODES = ("colocated", "naive", "gap", "gap_tsp", "gap_tsp_tag", "full")


class ConfigError(ValueError):
    """A configuration problem; the message names the key (or file) and what was expected."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LoraConfig(_Strict):
    enabled: bool = False
    rank: int = Field(32, ge=1)
    alpha: float = 64.0
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] | None = None  # None: the family's default (Flow-GRPO recipes)


class ModelConfig(_Strict):
    kind: str = "tiny_dit"
    path: str | None = None  # local diffusers directory / checkpoint; None = the built-in demo base weights
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    lora: LoraConfig = LoraConfig()
    prompt_cache_dir: str | None = None
    options: dict[str, Any] = {}  # family-specific extras (e.g. height/width/frames)


class TaskConfig(_Strict):
    name: str = "digits"
    prompts_file: str | None = None  # one prompt per line (real models); the digits task builds its own
    eval_prompts_file: str | None = None


class SamplerConfig(_Strict):
    num_steps: int = Field(10, ge=1)
    eval_num_steps: int | None = None  # default: num_steps
    noise_level: float = Field(0.7, ge=0.0)
    kind: Literal["flow_grpo", "dance", "cps"] = "flow_grpo"
    cfg_scale: float = Field(1.0, ge=0.0)


class TrainConfig(_Strict):
    prompts_per_step: int = Field(8, ge=1)  # P
    generations: int = Field(8, ge=2)  # G
    lr: float = Field(3e-4, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float | None = 1.0
    clip_range: float = Field(0.2, gt=0.0)
    adv_clip_max: float = Field(5.0, gt=0.0)
    std_mode: Literal["group", "global"] = "group"
    beta_kl: float = Field(0.0, ge=0.0)
    timestep_strategy: Literal["fraction", "uniform", "window"] = "fraction"
    timestep_fraction: float = Field(0.5, gt=0.0, le=1.0)
    window_size: int = Field(2, ge=1)
    window_range: tuple[int, int] | None = None
    chunk_generations: int = Field(8, ge=1)  # TSP chunk shape: generations x timesteps per forward/backward
    chunk_timesteps: int = Field(2, ge=1)
    ema_decay: float | None = None  # e.g. 0.9; EMA weights are used for eval
    cfg_in_training: bool = True  # apply CFG in the training forward when sampler.cfg_scale != 1
    # --- scale: memory plan, precision, recomputation, sharding ---
    chunk_cells: Literal["auto"] | None = None  # "auto": chunk shape from the memory plan (train.memory_gb)
    memory_gb: float | None = Field(None, gt=0.0)  # per-rank GPU memory the run is planned for; None: no check
    mixed_precision: Literal["none", "bf16", "fp16"] = "none"  # fp32 master weights + autocast compute
    loss_scale_init: float = Field(65536.0, gt=0.0)  # fp16: initial dynamic loss scale
    activation_checkpointing: bool = False  # recompute each transformer block's activations in backward
    sharding: Literal["none", "fsdp"] = "none"  # FSDP2 over the trainer ranks (fully_shard per block)
    cpu_offload: bool = False  # fsdp only: sharded weights, grads, AdamW state and EMA live in host memory


class EvalConfig(_Strict):
    every: int = Field(20, ge=0)  # 0 = only before and after training
    num_prompts: int = Field(64, ge=1)
    grid_prompts: int = Field(8, ge=1)


class RuntimeConfig(_Strict):
    mode: Literal["colocated", "naive", "gap", "gap_tsp", "gap_tsp_tag", "full"] = "colocated"
    generators: int = Field(1, ge=1)
    trainers: int = Field(1, ge=1)
    fragment_size: int = Field(4, ge=1)  # generations per fragment (GAP)
    max_stale_fraction: float = Field(0.25, ge=0.0, le=1.0)  # TCSS cap (0.5 made the demo end lower in 1 of 3 runs)
    address: str | None = None  # join an existing Ray cluster; None starts a local one
    generator_resources: dict[str, float] = {}
    trainer_resources: dict[str, float] = {}
    threads_per_worker: int = Field(1, ge=1)
    # --- added by the runtime (issue #4) ---
    publish: Literal["object_store", "broadcast"] = "object_store"  # weight path trainer rank 0 -> generators
    checkpoint_every: int = Field(0, ge=0)  # atomic checkpoint every N committed steps (0: only at the end)
    profile: str | None = None  # cost profile JSON for BTS (TAG modes); None: measured on the workers at start
    inject_failure: str | None = None  # test hook "<worker>@<step>[:exit]": that worker fails at that step


class LogConfig(_Strict):
    tensorboard: bool = False
    wandb: bool = False
    wandb_project: str = "digenrl"
    progress: bool = True


class Config(_Strict):
    run_dir: str = "runs/demo"
    seed: int = 0
    steps: int = Field(200, ge=0)
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    reward: dict[str, dict[str, Any]] = {"digits": {"weight": 1.0}}
    sampler: SamplerConfig = SamplerConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    log: LogConfig = LogConfig()

    @model_validator(mode="after")
    def _check(self) -> "Config":
        if not self.reward:
            raise ValueError("reward: at least one reward is required")
        if self.train.cpu_offload and self.train.sharding != "fsdp":
            raise ValueError("train.cpu_offload: needs train.sharding=fsdp (FSDP2 offloads the sharded state)")
        return self


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        nxt = node.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{dotted}: {k!r} is not a table")
        node = nxt
    node[keys[-1]] = value


def _format_validation(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        if e["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown key")
        else:
            got = e.get("input")
            lines.append(f"{key}: {e['msg']} (got {got!r})")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load YAML ``path`` (optional), apply ``key=value`` overrides (values parsed as YAML), validate."""
    tree: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {str(p)!r} is not valid YAML: {e}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(p)!r} must contain a mapping at top level")
        tree = loaded
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value (e.g. train.lr=1e-4)")
        key, raw = item.split("=", 1)
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r} has an empty key")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        _set_dotted(tree, key.strip(), value)
    try:
        return Config.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_format_validation(e)) from None


def dump_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
