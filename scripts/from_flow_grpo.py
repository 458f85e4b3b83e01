"""Write docs/from_flow_grpo.md: Flow-GRPO's config keys, their defaults there, the DigenRL keys and our defaults.

    python scripts/from_flow_grpo.py            # (re)write docs/from_flow_grpo.md
    python scripts/from_flow_grpo.py --check    # exit 1 if the page is not what this script writes

Our side is read from the config schema (``digenrl.config.Config``'s defaults) and the reward registry, so the
page follows the code; a DigenRL key that is not in the schema stops the script. Flow-GRPO's side is the table
below, copied from its sources (yifan123/flow_grpo at commit 54809b5f): ``config/base.py`` for the defaults,
``scripts/train_sd3.py`` / ``train_flux.py`` for the LoRA settings, ``flow_grpo/rewards.py`` (``multi_score``) for
the reward names, ``flow_grpo/prompts.py``-style datasets (``TextPromptDataset``: ``<dataset>/<split>.txt``,
``GenevalPromptDataset``: ``<dataset>/<split>_metadata.jsonl``) in the training scripts. Where a Flow-GRPO value
means something else here (``global_std=True`` is ``train.std_mode: global``) the row gives that translation,
and the comparison is made on it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from doc_check import write_or_check  # noqa: E402
OUT = ROOT / "docs" / "from_flow_grpo.md"
COMMIT = "54809b5f"
BASE = "config/base.py"

# (Flow-GRPO key, its default as written in its source, source file, DigenRL key, the Flow-GRPO default in
#  DigenRL's terms (compared with our default; None: not comparable), note)
ROWS: list[tuple[str, str, str, str, object, str]] = [
    ("seed", "42", BASE, "seed", 42, "noise is drawn per (seed, step, prompt, generation) here"),
    ("num_epochs", "100000", BASE, "steps", None, "one DigenRL step = one Flow-GRPO epoch"),
    ("logdir / run_name / save_dir", "\"logs\"", BASE, "run_dir", None, ""),
    ("resume_from", "None", BASE, "run_dir + `--resume`", None, "DigenRL resumes its own checkpoints; a Flow-GRPO `checkpoint-N/lora` goes to `model.lora_path`"),
    ("train.lora_path", "None", BASE, "model.lora_path", None, "PEFT dir / `adapter_model.safetensors`, or a diffusers LoRA; rank, alpha, targets from the adapter"),
    ("save_freq", "20", BASE, "runtime.checkpoint_every", 20, "in steps"),
    ("eval_freq", "20", BASE, "eval.every", 20, "in steps"),
    ("num_checkpoint_limit", "5", BASE, "runtime.keep_checkpoints", 5, ""),
    ("mixed_precision", "\"fp16\"", BASE, "train.mixed_precision", "fp16", "or `model.dtype` for the weights themselves"),
    ("use_lora", "True", BASE, "model.lora.enabled", True, ""),
    ("LoraConfig(r=32, lora_alpha=64) (SD3)", "r=32, alpha=64", "scripts/train_sd3.py", "model.lora.rank", 32, "`model.lora.alpha` 64; FLUX: r=64, alpha=128 (`scripts/train_flux.py`)"),
    ("dataset", "\"\"", BASE, "task.prompts_file", None, "the dataset directory itself (`train.txt` / `test.txt`, or `*_metadata.jsonl`)"),
    ("resolution", "768", BASE, "`model.options.height` / `width`", None, "the family's default when unset"),
    ("activation_checkpointing", "False", BASE, "train.activation_checkpointing", False, ""),
    ("fsdp_optimizer_offload", "False", BASE, "train.cpu_offload", False, "with `train.sharding: fsdp`"),
    ("pretrained.model", "\"runwayml/stable-diffusion-v1-5\"", BASE, "model.path", None, "a local diffusers directory (+ `model.kind`)"),
    ("sample.num_steps", "40", BASE, "sampler.num_steps", 40, ""),
    ("sample.eval_num_steps", "40", BASE, "sampler.eval_num_steps", 40, "null here = `sampler.num_steps`"),
    ("sample.guidance_scale", "4.5", BASE, "sampler.cfg_scale", 4.5, ""),
    ("sample.eval_guidance_scale", "4.5", BASE, "sampler.eval_cfg_scale", 4.5, "null here = `sampler.cfg_scale`"),
    ("sample.num_image_per_prompt", "1", BASE, "train.generations", 1, "G; Flow-GRPO's recipes use 24 (`config/grpo.py`); G >= 2 here"),
    ("sample.train_batch_size x GPUs x num_batches_per_epoch / num_image_per_prompt", "1 x GPUs x 2 / 1", BASE, "train.prompts_per_step", None, "P"),
    ("sample.train_batch_size", "1", BASE, "sampler.batch_size", 1, "the images a GPU samples at once (the recipes: 3 for FLUX to 9 for SD3); null here: a worker samples each fragment (a colocated worker: its share) in one batch, at most what its memory fits and 64"),
    ("sample.global_std", "True", BASE, "train.std_mode", "global", "True = global, False = group"),
    ("sample.noise_level", "0.7", BASE, "sampler.noise_level", 0.7, ""),
    ("sample.same_latent", "False", BASE, "sampler.same_latent", False, ""),
    ("sample.sde_window_size", "2", BASE, "train.window_size", 2, "with `train.timestep_strategy: window`"),
    ("sample.sde_window_range", "(0, 10)", BASE, "train.window_range", (0, 10), ""),
    ("train.batch_size", "1", BASE, "train.chunk_generations", None, "memory only (x `train.chunk_timesteps`); the gradient is the same"),
    ("train.use_8bit_adam", "False", BASE, "(none)", None, ""),
    ("train.learning_rate", "3e-4", BASE, "train.lr", 3e-4, ""),
    ("train.adam_beta1, adam_beta2", "0.9, 0.999", BASE, "train.betas", (0.9, 0.999), ""),
    ("train.adam_weight_decay", "1e-4", BASE, "train.weight_decay", 1e-4, ""),
    ("train.adam_epsilon", "1e-8", BASE, "train.adam_epsilon", 1e-8, ""),
    ("num_batches_per_epoch / train.gradient_accumulation_steps", "2 / 1", BASE, "train.minibatches_per_step", 2, "M optimizer steps per step, whole prompt groups by index (`train.minibatch_split: groups`); the recipes use 2"),
    ("train.max_grad_norm", "1.0", BASE, "train.max_grad_norm", 1.0, ""),
    ("train.num_inner_epochs", "1", BASE, "train.inner_epochs", 1, ""),
    ("train.cfg", "True", BASE, "train.cfg_in_training", True, ""),
    ("train.adv_clip_max", "5", BASE, "train.adv_clip_max", 5.0, ""),
    ("train.clip_range", "1e-4", BASE, "train.clip_range", 1e-4, ""),
    ("train.clip_range_lt / clip_range_gt", "1e-4 / 1e-4", BASE, "train.clip_range_low", 1e-4, "and `train.clip_range_high`; null here = `train.clip_range`"),
    ("train.timestep_fraction", "1.0", BASE, "train.timestep_fraction", 1.0, "`int(T * f)` first steps"),
    ("train.beta", "0.0", BASE, "train.beta_kl", 0.0, "the same KL form (`train.kl_form: flow_grpo`)"),
    ("train.ema", "False", BASE, "train.ema_decay", "null", "True = 0.9 with `train.ema_every: 8` (Flow-GRPO's EMAModuleWrapper); False = null"),
    ("sample.train_batch_size x GPUs", "1 x GPUs", BASE, "train.micro_batch", None, "samples of one micro-batch; only the unit of `train.ema_update` and `train.zero_adv_refill` (the forwards are cut by `train.chunk_*`)"),
    ("ema.step(params, global_step) per micro-batch", "per micro-batch", "scripts/train_sd3.py", "train.ema_update", "per_micro_batch", "k = P G / (M micro_batch) updates per optimizer step with the same n and weights; `per_commit`: once (arguably Flow-GRPO's bug)"),
    ("zero-advantage samples re-added at random", "always", "scripts/train_sd3.py", "train.zero_adv_refill", True, "until the kept count divides `num_batches_per_epoch` (= P G / micro_batch); seeded by (seed, step); runtime.mode colocated / naive"),
    ("torch.randperm of the samples per inner epoch", "always", "scripts/train_sd3.py", "train.minibatch_split", "samples", "`groups`: whole prompt groups by index; `samples` (seeded by (seed, step, inner epoch)) runs in the barrier modes (naive, colocated)"),
    ("per_prompt_stat_tracking", "True", BASE, "train.adv_baseline", "group", "True = group, False = batch"),
    ("reward_fn", "{} (recipes: {\"pickscore\": 1.0})", BASE, "reward", None, "the same `{name: weight}` table; see the reward names below"),
]

# Flow-GRPO's reward names (``flow_grpo/rewards.py`` ``multi_score``)
PEER_REWARDS = ("deqa", "ocr", "video_ocr", "imagereward", "pickscore", "qwenvl", "aesthetic", "jpeg_compressibility",
                "unifiedreward", "geneval", "seedscore", "clipscore", "image_similarity")


def _default(key: str):
    """Our default of a dotted config key (``ValueError`` if the schema has no such key)."""
    from digenrl.config import Config

    node: object = Config()
    for part in key.split("."):
        if part == "options":  # model.options.*: a free table, the family's defaults
            return "family default"
        if not hasattr(node, part) or part not in type(node).model_fields:
            raise ValueError(f"{key!r} is not a DigenRL config key")
        node = getattr(node, part)
    return node


def _fmt(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_fmt(x)}" for k, x in v.items()) + "}"
    return str(v)


def _same(a, b) -> bool:
    a = None if a == "null" else a
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and not isinstance(b, bool):
        return abs(float(a) - float(b)) <= 1e-12 * max(1.0, abs(float(a)))
    return a == b


def _keys_of(cell: str) -> list[str]:
    return [k.strip() for k in cell.split("/") if k.strip() and k.strip()[0].isalpha() and "(" not in k and "`" not in k]


def render() -> str:
    from digenrl.rewards.registry import ALIASES, BUILTIN, NOT_SHIPPED

    lines = [
        "# Moving from Flow-GRPO",
        "",
        "<!-- generated by scripts/from_flow_grpo.py from the config schema; edit the script, not this page -->",
        "",
        "A Flow-GRPO run in DigenRL terms: its config keys with their defaults there (yifan123/flow_grpo at "
        f"commit {COMMIT}, the source file of each value named), the DigenRL key and our default (from "
        "`src/digenrl/config/`). **differs** marks a default that is not the same; set the key to keep "
        "Flow-GRPO's behaviour. What each key means, and the formulas tested against Flow-GRPO's, are in "
        "[recipes.md](recipes.md); the shipped presets (`configs/*.yaml`) carry Flow-GRPO's recipe values "
        "(`config/grpo.py`) with their sources.",
        "",
        "What loads as it is:",
        "",
        "- **LoRA checkpoints**: `model.lora_path=<logdir>/checkpoints/checkpoint-N/lora` (the directory "
        "`PeftModel.save_pretrained` wrote: `adapter_model.safetensors` with `base_model.model.*` keys and "
        "`adapter_config.json`), the checkpoint directory above it, the file itself, or a diffusers "
        "`pytorch_lora_weights.safetensors`. The run trains on that adapter; its rank, alpha and targets set "
        "`model.lora` (recorded in the run's config.yaml).",
        "- **Datasets**: `task.name=text task.prompts_file=dataset/ocr` (its `train.txt`, with `test.txt` as the "
        "eval set) or `task.prompts_file=dataset/geneval` (`train_metadata.jsonl` / `test_metadata.jsonl`, the "
        "metadata kept for the `geneval` reward).",
        "- **Reward tables**: `reward={pickscore: 0.5, ocr: 1.0}`: a bare number is the weight.",
        "- **Monitoring**: `log.wandb=true` (checked before the run starts; `WANDB_MODE=offline` works), "
        "`log.tensorboard=true`: per-reward curves (`reward/<name>`) and the sample grids; `no_signal` and a "
        "warning when every reward of a step ties (nothing trains).",
        "",
        "## Config keys",
        "",
        "| Flow-GRPO | default there | source | DigenRL | our default | |",
        "|---|---|---|---|---|---|",
    ]
    for peer, peer_default, source, ours, peer_here, note in ROWS:
        keys = _keys_of(ours)
        if keys and ours != "(none)":
            our = _default(keys[0])
            for extra in keys[1:]:
                _default(extra)
            differs = peer_here is not None and not _same(peer_here, our)
            our_cell = f"`{_fmt(our)}`"
        else:
            differs, our_cell = False, ""
        mark = "**differs**" if differs else ""
        text = f"{mark}; {note}" if mark and note else mark or note
        ours_cell = ours if ours.startswith("(") or "`" in ours else f"`{ours}`"
        lines.append(f"| `{peer}` | `{peer_default}` | `{source}` | {ours_cell} | {our_cell} | {text} |")
    lines += [
        "",
        "## Reward names",
        "",
        "Flow-GRPO's `reward_fn` names (`flow_grpo/rewards.py`, `multi_score`) and what they are here "
        "(`src/digenrl/rewards/registry.py`: `BUILTIN`, `ALIASES`, `NOT_SHIPPED`). A name without a DigenRL "
        "reward is refused by name (exit 2); write it as a plug-in (`docs/rewards.md`).",
        "",
        "| Flow-GRPO | DigenRL | |",
        "|---|---|---|",
    ]
    for name in PEER_REWARDS:
        if name in BUILTIN:
            lines.append(f"| `{name}` | `{name}` | the same name |")
        elif name in ALIASES:
            target, defaults = ALIASES[name]
            extra = f"; defaults {', '.join(f'{k}={v}' for k, v in defaults.items())}" if defaults else ""
            lines.append(f"| `{name}` | `{target}` | accepted as `{name}`{extra} |")
        elif name in NOT_SHIPPED:
            lines.append(f"| `{name}` | (none) | {NOT_SHIPPED[name]} |")
        else:
            raise ValueError(f"reward {name!r} of Flow-GRPO is neither built in, an alias nor listed as not shipped")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/from_flow_grpo.md is not up to date")
    args = ap.parse_args(argv)
    return write_or_check(OUT, render(), args.check, "scripts/from_flow_grpo.py", ROOT)


if __name__ == "__main__":
    sys.exit(main())
