"""Which config a checkpoint resumes under: the same math of a step, whatever runs it.

A checkpoint records its run's config (``train.checkpoint``). A resume may change where and how the work runs
(pools, placement, chunk shapes, logging, eval, the run's length: ``FREE_KEYS``); anything else changes what a
step computes, and the resume is refused naming the keys (``check_resume_config``). The on-policy modes compute
the same (I1), so a run may resume in another one; ``full`` (TCSS) is its own math. ``config_hash`` is the hash
of ``math_config``, kept in every checkpoint.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from digenrl.config import Config, ConfigError, move_old_keys

# Keys that may change on resume: where and how the work runs, logging and eval, the run length. Everything
# else (model, task, reward, sampler, train, seed, the policy class of the mode) is the math of a step.
# train.shard_groups is how many data-parallel replicas hold the shards: what a sharded checkpoint depends on is
# the size of one shard group, runtime.trainers / train.shard_groups, which ``check_resume_config`` compares.
FREE_KEYS = ("run_dir", "steps", "resume", "log", "eval", "model.device", "model.prompt_cache_dir",
             "train.chunk_generations", "train.chunk_timesteps", "train.shard_groups", "runtime", "tuning",
             "sampler.eval_num_steps")  # (the eval's sampler only)
# ...except these runtime and tuning keys, which change what a step computes
MATH_KEYS = ("runtime.max_stale_fraction", "tuning.loss_scale_init")


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def math_config(cfg: Config | dict) -> dict[str, Any]:
    """The dotted keys of ``cfg`` that define what a step computes (``FREE_KEYS`` removed)."""
    tree = cfg.model_dump(mode="json") if isinstance(cfg, Config) else cfg
    out = {k: v for k, v in _flatten(tree).items()
           if k in MATH_KEYS or not any(k == f or k.startswith(f + ".") for f in FREE_KEYS)}
    mode = tree.get("runtime", {}).get("mode", "colocated")
    out["runtime.mode"] = "tcss" if mode == "full" else "on_policy"  # the on-policy modes compute the same (I1)
    if mode != "full":
        out.pop("runtime.max_stale_fraction", None)
    return out


def config_hash(cfg: Config | dict) -> str:
    return hashlib.sha256(json.dumps(math_config(cfg), sort_keys=True, default=str).encode()).hexdigest()[:16]


def _cut(v: Any, n: int = 80) -> str:
    s = json.dumps(v, default=str)
    return s if len(s) <= n else s[: n - 3] + "..."


def check_resume_config(saved: dict, cfg: Config, where: str = "the checkpoint's config") -> None:
    """Refuse (``ConfigError`` naming the keys) a config whose step math differs from the checkpoint's, and a
    ``saved`` config (``where``: its name in the error) that sets both names of a moved key."""
    saved = copy.deepcopy(saved)
    move_old_keys(saved, where)  # written before keys moved (config.load.MOVED): its keys in their new homes
    try:  # keys added to the config since the checkpoint was written take their defaults (today's behaviour)
        saved = Config.model_validate(saved).model_dump(mode="json")
    except ValueError:
        pass  # a key was removed since: compare what is there
    old, new = math_config(saved), math_config(cfg)
    diff = sorted(k for k in old.keys() | new.keys() if old.get(k, "<unset>") != new.get(k, "<unset>"))
    if diff:
        parts = [f"{k} (checkpoint {_cut(old.get(k, '<unset>'))}, now {_cut(new.get(k, '<unset>'))})" for k in diff[:5]]
        more = f" and {len(diff) - 5} more" if len(diff) > 5 else ""
        raise ConfigError("resume: the config changes the math of a step: " + "; ".join(parts) + more
                          + ". Resume with the run's own config (run_dir/config.yaml)")
    sharding = saved.get("train", {}).get("sharding", "none")
    ranks = saved.get("runtime", {}).get("trainers", 1)
    groups = saved.get("train", {}).get("shard_groups", 1)
    now = cfg.runtime.trainers // cfg.train.shard_groups
    if sharding != "none" and ranks // groups != now:  # (sharded_checkpoint: the same mesh size only)
        raise ConfigError(f"runtime.trainers: the checkpoint holds the shards of a shard group of {ranks // groups} "
                          f"trainer ranks (train.sharding={sharding}, runtime.trainers={ranks}, "
                          f"train.shard_groups={groups}) and loads only onto groups of as many; resume with "
                          f"runtime.trainers / train.shard_groups = {ranks // groups} (e.g. runtime.trainers={ranks} "
                          f"train.shard_groups={groups}), now {cfg.runtime.trainers} / {cfg.train.shard_groups} = {now}")
