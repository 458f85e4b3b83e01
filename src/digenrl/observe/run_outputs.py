"""What a run leaves in ``run_dir``: resolved config, metrics.jsonl, reward curve, before/after sample grids,
a safetensors checkpoint and summary.json.

``prepare_run_dir`` is called only after the config validated, so a refused config writes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from digenrl.config import Config, dump_config
from digenrl.observe.plots import reward_curve, sample_grid


def prepare_run_dir(cfg: Config) -> Path:
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, run_dir / "config.yaml")
    return run_dir


def write_grid(run_dir: Path, name: str, batch, n: int, title: str) -> None:
    n = min(n, len(batch))
    scores = batch.rewards[:n].tolist() if batch.rewards is not None else None
    sample_grid(batch.images[:n], [p.text for p in batch.prompts[:n]], run_dir / name, title=title, scores=scores)


def save_checkpoint(policy, run_dir: Path, meta: dict[str, str]) -> Path:
    from safetensors.torch import save_file

    path = run_dir / "checkpoint.safetensors"
    if hasattr(policy, "save"):
        policy.save(path, meta)
    else:
        state = {k: v.detach().contiguous().cpu() for k, v in policy.trainable_state_dict().items()}
        save_file(state, str(path), metadata=meta)
    return path


def finish_run(run_dir: Path, rows: list[dict], summary: dict[str, Any], title: str) -> None:
    reward_curve(rows, run_dir / "reward_curve.png", title=title)
    tmp = run_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2))
    tmp.replace(run_dir / "summary.json")
