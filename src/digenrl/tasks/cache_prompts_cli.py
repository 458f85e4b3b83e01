"""``digenrl cache-prompts``: encode a task's prompt files once into ``model.prompt_cache_dir``
(``models.prompt_cache``), loading only the family's text encoders."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """``digenrl cache-prompts --config X [key=value ...]``: encode the task's prompt files into the cache."""
    import argparse

    from digenrl.config import ConfigError, load_config

    ap = argparse.ArgumentParser(prog="digenrl cache-prompts", description="Encode the task's prompt files once into model.prompt_cache_dir, loading only the family's text encoders (then the workers need none).")
    ap.add_argument("--config", default=None, help="run config YAML (optional: overrides alone also work)")
    from digenrl.cli_args import add_overrides, parse_with_overrides

    args = parse_with_overrides(add_overrides(ap), argv)  # KEY=VALUE positionals and --set KEY=VALUE
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {e}")
        return 2
    if not cfg.model.prompt_cache_dir:
        print("error: model.prompt_cache_dir must be set to build a prompt cache")
        return 2
    from digenrl.models.diffusers_common import TextEncoderOnly
    from digenrl.models.diffusers_files import ModelFilesError
    from digenrl.models.registry import family_policy_class
    from digenrl.tasks.text_prompts import TextPromptTask

    try:
        if not cfg.task.prompts_file:
            raise ValueError("task.prompts_file: no prompt file to cache")
        texts = TextPromptTask(cfg.task.prompts_file, cfg.task.eval_prompts_file).all_texts()  # a dataset dir too
        family = family_policy_class(cfg.model.kind)
        if family is None:
            raise ValueError(f"model.kind: {cfg.model.kind!r} has no text encoders to cache (diffusers families only)")
        encoders = TextEncoderOnly(family, cfg.model)  # text encoders only: no transformer, VAE or LoRA
    except (ValueError, ModelFilesError) as e:
        print(f"error: {e}")
        return 2
    n = encoders.cache_prompts(texts)
    print(f"cached {n} new prompt embeddings in {cfg.model.prompt_cache_dir} (loaded: {', '.join(encoders.loaded)})")
    return 0
