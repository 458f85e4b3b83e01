"""Helpers of the runtime tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

SMALL = ["steps=3", "train.prompts_per_step=2", "train.generations=4", "sampler.num_steps=4",
         "train.chunk_generations=2", "train.chunk_timesteps=2", "runtime.fragment_size=2",
         "eval.num_prompts=4", "eval.grid_prompts=4", "eval.every=0", "log.progress=false",
         "train.ema_decay=null"]  # the checkpoints are the live weights (the oracle compares those)


def make_cfg(model_path, run_dir, *overrides):
    from digenrl.config import load_config

    return load_config(None, [f"model.path={model_path}", f"run_dir={run_dir}", *SMALL, *overrides])
