"""What a run leaves in ``run_dir``, the same for the single-process loop and the Ray runtime.

``RunOutputs`` is the one lifecycle: ``config.yaml`` (resolved config) and ``metrics.jsonl`` when it is created
(only after the config validated, so a refused config writes nothing); ``before`` (eval before RL: step-0 row
and ``samples_before.png``); ``log`` (one row per step); ``after`` (final eval row and ``samples_after.png``);
``write_checkpoint`` (``checkpoint.safetensors``, written atomically: temp file, fsync, rename); ``finish``
(``summary.json`` and ``reward_curve.png``); ``failure`` (``failure.json``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from digenrl.config import Config, dump_config
from digenrl.observe.plots import reward_curve, sample_grid


def prepare_run_dir(cfg: Config) -> Path:
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, run_dir / "config.yaml")
    return run_dir


def write_atomic(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` so that a crash leaves the old file or the new one, never a torn one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def write_grid(run_dir: Path, name: str, batch, n: int, title: str) -> None:
    n = min(n, len(batch))
    scores = batch.rewards[:n].tolist() if batch.rewards is not None else None
    sample_grid(batch.images[:n], [p.text for p in batch.prompts[:n]], run_dir / name, title=title, scores=scores)


def save_checkpoint(policy, run_dir: Path, meta: dict[str, str]) -> Path:
    """``run_dir/checkpoint.safetensors`` of ``policy`` (its own format if it has ``save``)."""
    from safetensors.torch import save_file

    path = run_dir / "checkpoint.safetensors"
    if hasattr(policy, "save"):
        policy.save(path, meta)
    else:
        state = {k: v.detach().contiguous().cpu() for k, v in policy.trainable_state_dict().items()}
        save_file(state, str(path), metadata=meta)
    return path


def checkpoint_bytes(policy, meta: dict[str, str]) -> bytes:
    """The bytes of ``save_checkpoint(policy, ...)`` (written where the run lives by ``RunOutputs``)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        return save_checkpoint(policy, Path(d), meta).read_bytes()


def finish_run(run_dir: Path, rows: list[dict], summary: dict[str, Any], title: str) -> None:
    reward_curve(rows, run_dir / "reward_curve.png", title=title)
    write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2).encode())


class RunOutputs:
    """The outputs of one training run (see the module docstring for the order of the calls)."""

    def __init__(self, cfg: Config):
        from digenrl.observe.metrics import MetricsWriter

        self.cfg = cfg
        self.run_dir = prepare_run_dir(cfg)
        self.writer = MetricsWriter(self.run_dir, tensorboard=cfg.log.tensorboard, wandb=cfg.log.wandb,
                                    wandb_project=cfg.log.wandb_project, config=cfg.model_dump(mode="json"))
        self.eval0 = self.eval1 = float("nan")

    def before(self, reward: float, batch) -> None:
        """The eval before RL: step-0 row and ``samples_before.png``."""
        self.eval0 = reward
        write_grid(self.run_dir, "samples_before.png", batch, self.cfg.eval.grid_prompts,
                   f"before RL (eval reward {reward:.3f})")
        self.writer.log({"step": 0, "eval_reward": reward})

    def log(self, row: dict) -> None:
        self.writer.log(row)

    def after(self, reward: float, batch) -> None:
        """The eval after the last step: final row and ``samples_after.png``."""
        self.eval1 = reward
        self.writer.log({"step": self.cfg.steps, "eval_reward": reward, "final": True})
        write_grid(self.run_dir, "samples_after.png", batch, self.cfg.eval.grid_prompts,
                   f"after {self.cfg.steps} RL steps (eval reward {reward:.3f})")

    def write_checkpoint(self, data: bytes) -> Path:
        return write_atomic(self.run_dir / "checkpoint.safetensors", data)

    def finish(self, *, wall_s: float, version: int, **extra) -> dict:
        """``summary.json`` (eval before/after, steps, wall time, throughput, mode, version, ``extra``) and
        ``reward_curve.png``; returns the summary."""
        cfg = self.cfg
        samples = cfg.train.prompts_per_step * cfg.train.generations * cfg.steps
        summary = {"eval_reward_initial": self.eval0, "eval_reward_final": self.eval1, "steps": cfg.steps,
                   "wall_s": wall_s, "samples_per_s": samples / wall_s if wall_s > 0 else 0.0,
                   "mode": cfg.runtime.mode, "version": version, **extra}
        finish_run(self.run_dir, self.writer.rows, summary,
                   title=f"{cfg.task.name} ({cfg.runtime.mode}): eval {self.eval0:.3f} -> {self.eval1:.3f}")
        return summary

    def failure(self, record: dict) -> None:
        write_atomic(self.run_dir / "failure.json", json.dumps(record, indent=2).encode())

    def close(self) -> None:
        self.writer.close()
