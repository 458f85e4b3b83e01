"""Up-front checks of a run's inputs, before the run directory is created or Ray starts.

``validate_run(cfg)`` raises ``ConfigError`` (the CLI: exit 2, one message naming the key / file / value,
nothing written) for what would otherwise fail later as a traceback, possibly inside a Ray actor after the run
directory was written:

* ``model.device``: a torch device this machine has (no ``cuda`` without CUDA, no ``cuda:3`` on two GPUs);
* ``log.wandb`` / ``log.tensorboard``: their packages are installed;
* ``run_dir``: empty, the current directory, the home directory or ``/``; a file, or under a file, or not
  writable (``runtime.run_outputs``: what an existing run_dir may hold);
* the model: tiny_dit weights must be a readable safetensors file with its config metadata; a diffusers
  directory must have the family layout (``model_index.json``, transformer / vae / scheduler) with readable
  JSON configs and safetensors files whose headers parse and whose tensors lie inside the file (truncation);
* the task / model pairing (digits prompts need tiny_dit; text prompts need a diffusers family);
* prompt files (``task.prompts_file`` / ``eval_prompts_file``) and ``train.prompts_per_step`` against them;
* prompt-cache coverage when the model runs without text encoders (every prompt and the negative prompt);
* reward names and typed options (``rewards.registry.validate_reward_spec``), and those of ``eval.guard``.

Only headers and small JSON files are read; nothing is loaded into a model. Long values are cut (``cut``).
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Callable

from digenrl.config import Config, ConfigError
from digenrl.models.specs import SPECS

DIFFUSERS_KINDS = tuple(SPECS)  # the registry's diffusers families (tiny_dit is the built-in demo model)


def cut_text(s: str, n: int = 120) -> str:
    """``s`` cut to about ``n`` characters (a 50 MB prompt line must not reach the terminal)."""
    return s if len(s) <= n else f"{s[: max(8, n - 24)]}... ({len(s)} chars)"


def cut(value: Any, n: int = 120) -> str:
    """``repr(value)`` cut to about ``n`` characters."""
    return cut_text(repr(value), n)


@contextmanager
def refused(*errors: type[BaseException], key: str = "", n: int | None = None):
    """An error of ``errors`` raised in the block becomes a ``ConfigError``: ``key: message``, cut to ``n``."""
    try:
        yield
    except errors as e:
        msg = str(e) if n is None else cut_text(str(e), n)
        raise ConfigError(f"{key}: {msg}" if key else msg) from None


def checks(cfg: Config, *, run: bool = True) -> list[Callable[[], object]]:
    """The checks in order. The inputs (what ``eval`` and ``sample`` need): device, model, task, prompts, prompt
    cache and rewards; ``run`` (``digenrl train``): ``run_dir``, logging packages and threads first, the inputs
    (a step's prompts must fit the prompt file), then ``eval.guard``."""
    inputs = [partial(check_device, cfg), partial(check_model, cfg),
              lambda: check_prompt_cache(cfg, check_task(cfg, training=run)), partial(check_rewards, cfg.reward)]
    if not run:
        return inputs
    return [partial(check_run_dir, cfg.run_dir), partial(check_logging, cfg), partial(check_threads, cfg), *inputs,
            partial(check_guard, cfg)]


def validate_run(cfg: Config, run: bool = True) -> None:
    """Everything ``digenrl train`` needs (``run``; else what ``eval`` and ``sample`` need); the first problem
    raises."""
    for check in checks(cfg, run=run):
        check()


def problems(cfg: Config) -> list[str]:
    """Every check of ``digenrl train``, each run on its own: their one-line errors (``digenrl check``)."""
    out = []
    for check in checks(cfg):
        try:
            check()
        except ConfigError as e:
            out.append(str(e))
    return out


# ---- run_dir -----------------------------------------------------------------------------------------------
def check_run_dir(run_dir: str) -> None:
    if not str(run_dir).strip():
        raise ConfigError("run_dir: is empty (an unset shell variable?); a run needs a directory of its own, "
                          "e.g. run_dir=runs/my_run")
    p = Path(run_dir).expanduser()
    here = p.resolve()
    for what, where in (("the current directory", Path.cwd), ("the home directory", Path.home),
                        ("the filesystem root", lambda: Path(here.anchor or "/"))):
        try:
            d = where().resolve()
        except (OSError, RuntimeError):  # no cwd / no home: nothing to protect there
            continue
        if here == d:  # --overwrite would delete its checkpoints/, tensorboard/, config.yaml ...
            raise ConfigError(f"run_dir: {cut(str(run_dir))} is {what} ({cut(str(here))}); a run needs a "
                              "directory of its own, e.g. run_dir=runs/my_run")
    if p.exists() and not p.is_dir():
        raise ConfigError(f"run_dir: {cut(str(p))} exists and is not a directory")
    anc = p
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        raise ConfigError(f"run_dir: {cut(str(p))} cannot be created: {cut(str(anc))} is not a directory")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise ConfigError(f"run_dir: {cut(str(p))} is not writable (no write permission on {cut(str(anc))})")


# ---- device and logging ------------------------------------------------------------------------------------
def check_device(cfg: Config) -> None:
    """``model.device`` names a device this machine has (skipped when joining a Ray cluster: the workers' GPUs
    are not this machine's)."""
    import torch

    dev = cfg.model.device
    try:
        d = torch.device(dev)
    except (RuntimeError, TypeError) as e:
        raise ConfigError(f"model.device: {cut(dev)} is not a torch device ({e}); e.g. cpu, cuda, cuda:1") from None
    if cfg.runtime.address or d.type != "cuda":
        return
    if not torch.cuda.is_available():
        build = "a CPU-only build of torch" if torch.version.cuda is None else f"torch built for CUDA {torch.version.cuda}"
        raise ConfigError(f"model.device: {cut(dev)}, but torch sees no CUDA device on this machine ({build}, "
                          "torch.cuda.is_available() is false); use model.device=cpu or a machine / torch with CUDA")
    n = torch.cuda.device_count()
    if d.index is not None and d.index >= n:
        raise ConfigError(f"model.device: {cut(dev)}, but this machine has {n} CUDA device(s) (cuda:0..cuda:{n - 1})")


def check_threads(cfg: Config) -> None:
    """``runtime.threads_per_worker`` at most this machine's cores in a local run (more only oversubscribes
    them: a 3 s run took 4 minutes with 1000); joining a Ray cluster, the workers' nodes decide."""
    n, cores = cfg.runtime.threads_per_worker, os.cpu_count() or 1
    if cfg.runtime.address is None and n > cores:
        raise ConfigError(f"runtime.threads_per_worker: {n} threads per worker, but this machine has {cores} CPU "
                          f"core(s); use at most {cores}")


def check_logging(cfg: Config) -> None:
    """The packages ``log.wandb`` / ``log.tensorboard`` write with are importable (``import wandb`` at step 0
    would otherwise end the run with a traceback after the run directory was made)."""
    import importlib

    for key, how in (("wandb", "`pip install wandb` (WANDB_MODE=offline needs no account)"),
                     ("tensorboard", "`pip install tensorboard`")):
        try:
            if getattr(cfg.log, key):
                importlib.import_module(key)
        except ImportError:
            raise ConfigError(f"log.{key}: true, but the {key} package is not installed; {how} or set "
                              f"log.{key}=false") from None


# ---- model -------------------------------------------------------------------------------------------------
def _header(path: Path, key: str) -> dict:
    from digenrl.safe_files import safetensors_header

    with refused(ValueError, key=key):
        return safetensors_header(path)


def check_model(cfg: Config) -> None:
    from digenrl.models.registry import policy_kinds

    m = cfg.model
    if m.kind not in policy_kinds():
        raise ConfigError(f"model.kind: unknown policy kind {cut(m.kind)}; expected one of {policy_kinds()}")
    if m.checkpoint:
        if not Path(m.checkpoint).expanduser().is_file():
            raise ConfigError(f"model.checkpoint: {cut(m.checkpoint)} does not exist")
        _header(Path(m.checkpoint).expanduser(), "model.checkpoint")
    if m.kind == "tiny_dit":
        from digenrl.models.tiny_dit import DEFAULT_BASE

        path = Path(m.path).expanduser() if m.path else DEFAULT_BASE
        if not path.is_file():
            raise ConfigError(f"model.path: tiny_dit checkpoint {cut(str(path))} does not exist")
        meta = _header(path, "model.path").get("__metadata__") or {}
        if "tiny_dit_config" not in meta:
            raise ConfigError(f"model.path: {cut(str(path))} is not a tiny_dit checkpoint (no tiny_dit_config metadata)")
        return
    from digenrl.models.diffusers_files import (ModelFilesError, check_config_types, check_model_dir,
                                                present_components)

    with refused(ModelFilesError):
        check_model_dir(m.path, m.kind, ("transformer", "vae", "scheduler"))
    from digenrl.models.dir_checks import check_family, check_resolution, check_sequence_split
    from digenrl.models.registry import family_policy_class

    spec = family_policy_class(m.kind).spec
    options = {**dict(spec.default_options), **m.options}
    with refused(ValueError):
        check_family(m.path, m.kind)  # model_index.json's classes are model.kind's
        check_resolution(m.path, m.kind, options)
        check_sequence_split(m.path, m.kind, options, {
            "train.sequence_parallel": cfg.train.sequence_parallel.degree,
            "runtime.generator_sequence_parallel": cfg.runtime.generator_sequence_parallel.degree})
    root = Path(m.path).expanduser()
    comps = ["transformer", "vae", "scheduler"] + present_components(m.path, spec.text_components)
    for comp in comps:
        for f in sorted((root / comp).glob("*.json")):
            try:
                json.loads(f.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ConfigError(f"model.path: {cut(str(f))} is not valid JSON ({e})") from None
        for f in sorted((root / comp).glob("*.safetensors")):
            _header(f, "model.path")
    for comp in ("transformer", "vae", "scheduler"):  # values of the type their diffusers class declares
        with refused(ModelFilesError, key="model.path", n=400):
            check_config_types(m.path, comp)
    if m.lora.enabled and m.lora.target_modules:  # (the family's default targets are known to match)
        from digenrl.models.diffusers_files import transformer_module_names
        from digenrl.models.lora import check_targets

        names = transformer_module_names(m.path)
        with refused(ValueError):
            if names is not None:
                check_targets(names, list(m.lora.target_modules), m.kind)


# ---- task / prompts ----------------------------------------------------------------------------------------
def check_task(cfg: Config, training: bool = False) -> list[str]:
    """Check the task, its prompt files and its pairing with the model (``training``: also that a step's
    prompts fit the prompt file); return every prompt text."""
    t, kind = cfg.task, cfg.model.kind
    if t.name == "digits":
        if kind != "tiny_dit":
            raise ConfigError(f"task.name: the digits task needs model.kind=tiny_dit (got model.kind={kind!r}); "
                              f"use task.name=text with task.prompts_file for a diffusers model")
        from digenrl.tasks.digits import ALL_PAIRS

        if training and cfg.train.prompts_per_step > len(ALL_PAIRS):
            raise ConfigError(f"train.prompts_per_step={cfg.train.prompts_per_step} exceeds the {len(ALL_PAIRS)} "
                              "prompts of the digits task")
        return []
    if t.name != "text":
        raise ConfigError(f"task.name: unknown task {cut(t.name)}; expected 'digits' or 'text'")
    if kind == "tiny_dit":
        raise ConfigError("task.name: the text task needs a diffusers model.kind "
                          f"({', '.join(DIFFUSERS_KINDS)}); tiny_dit only draws digits (task.name=digits)")
    if not t.prompts_file:
        raise ConfigError("task.prompts_file: required when task.name is 'text'")
    from digenrl.tasks.text_prompts import PromptFileError, dataset_files, read_prompt_file

    try:  # a Flow-GRPO dataset directory: its train / test files
        train_file, eval_file = dataset_files(t.prompts_file, t.eval_prompts_file)
    except PromptFileError as e:
        key = "task.eval_prompts_file" if t.eval_prompts_file and str(t.eval_prompts_file) in str(e) else "task.prompts_file"
        raise ConfigError(f"{key}: {cut_text(str(e), 300)}") from None
    texts: list[str] = []
    for key, f in (("task.prompts_file", train_file), ("task.eval_prompts_file", eval_file)):
        if not f:
            continue
        with refused(PromptFileError, key=key, n=300):
            prompts = read_prompt_file(f)
        if training and key == "task.prompts_file" and cfg.train.prompts_per_step > len(prompts):
            raise ConfigError(f"train.prompts_per_step={cfg.train.prompts_per_step} exceeds the {len(prompts)} "
                              f"prompts of task.prompts_file {cut(str(f))}")
        texts += [p.text for p in prompts]
    return list(dict.fromkeys(texts))


def eval_warnings(cfg: Config) -> list[str]:
    """What the eval does that a user may not expect (``digenrl train`` and ``check`` print these at start): no
    eval prompt file (the eval reuses the train prompts), or fewer eval prompts than ``eval.num_prompts``."""
    t, n = cfg.task, cfg.eval.num_prompts
    out = []
    if t.name == "digits":
        from digenrl.tasks.digits import ALL_PAIRS

        have, where = len(ALL_PAIRS), "the digits task"
    elif t.name == "text" and t.prompts_file:
        from digenrl.tasks.text_prompts import PromptFileError, dataset_files, read_prompt_file

        try:
            train_file, eval_file = dataset_files(t.prompts_file, t.eval_prompts_file)
            have = len(read_prompt_file(eval_file or train_file))
        except PromptFileError:
            return []  # reported by check_task
        where = f"task.eval_prompts_file {cut(str(eval_file))}" if eval_file else f"task.prompts_file {cut(str(train_file))}"
        if not eval_file:
            out.append("task.eval_prompts_file: not set, so the eval scores the first train prompts (not held out); "
                       "set it (or use a dataset directory with a test split) for a held-out eval")
    else:
        return []
    if n > have:
        out.append(f"eval.num_prompts: {n}, but {where} has {have} prompts: each eval uses those {have}")
    return out


def check_prompt_cache(cfg: Config, texts: list[str]) -> None:
    """``model.prompt_cache_dir``: without text encoders it must hold every prompt (and the negative prompt); with
    them, a cache written by another encoder or with other encoding options (``max_sequence_length``) is refused
    up front (the run would otherwise add its own encoder id to the directory and break it)."""
    m = cfg.model
    if m.kind not in DIFFUSERS_KINDS:
        return
    from digenrl.models.diffusers_files import present_components
    from digenrl.models.prompt_cache import PromptCache
    from digenrl.models.registry import family_policy_class, run_encoder_id

    spec = family_policy_class(m.kind).spec
    has_encoders = len(present_components(m.path, spec.text_components)) == len(spec.text_components)
    encoded = m.options.get("load_text_encoders", "auto") is not False and has_encoders  # at run time
    if not m.prompt_cache_dir:
        if encoded:
            return
        raise ConfigError(f"model.prompt_cache_dir: required: {cut(m.path)} is used without text encoders; "
                          "build a cache with `digenrl cache-prompts`")
    with refused(ValueError, key="model.prompt_cache_dir"):
        ids = PromptCache.read_encoder_ids(m.prompt_cache_dir)
    if encoded:
        want = run_encoder_id(m)
        if ids and want not in ids:
            raise ConfigError(f"model.prompt_cache_dir: {cut(m.prompt_cache_dir)} holds the embeddings of encoder "
                              f"{ids[0]}, not of this run's {want} (another model directory or other encoding "
                              "options, e.g. model.options.max_sequence_length); use another directory, or delete "
                              "this one and rebuild it with `digenrl cache-prompts`")
        return
    if len(ids) != 1:
        raise ConfigError(f"model.prompt_cache_dir: {cut(m.prompt_cache_dir)} holds "
                          f"{'no prompt cache manifest' if not ids else f'{len(ids)} encoder ids'}; "
                          "build one (one encoder per directory) with `digenrl cache-prompts`")
    negative = str(m.options.get("negative_prompt", ""))
    missing = PromptCache(m.prompt_cache_dir, ids[0]).uncovered(texts + [negative])
    if missing:
        raise ConfigError(f"model.prompt_cache_dir: {len(missing)} prompt(s) are not in the cache "
                          f"{cut(m.prompt_cache_dir)}, e.g. {cut(missing[0], 80)}; run `digenrl cache-prompts` "
                          "with the same config")


# ---- rewards -----------------------------------------------------------------------------------------------
def check_rewards(spec: dict[str, dict[str, Any]]) -> None:
    """Reward names (built-in, entry point or ``module:factory``) and typed options: the registry's own check."""
    from digenrl.rewards.registry import RewardConfigError, validate_reward_spec

    with refused(RewardConfigError, FileNotFoundError, n=2000):  # (the values inside are cut where they are made)
        validate_reward_spec(spec)


def check_guard(cfg: Config) -> None:
    """``eval.guard``: its reward names and options (as ``reward``'s), drift options and tolerances."""
    if not cfg.eval.guard:
        return
    from digenrl.observe.hacking_guard import parse_guard

    with refused(ValueError, FileNotFoundError, n=2000):
        parse_guard(cfg.eval.guard, cfg.eval.guard_tolerance)
