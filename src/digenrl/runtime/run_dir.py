"""The run directory: one run per directory, marked (``.digenrl-run``: only the outputs it names are ever deleted)
and locked (``lock_run_dir``: ``fcntl.flock`` on ``.digenrl-lock`` for the run's whole life), and what a resumed or
replaced run keeps of it: the rules are docs/reliability.md's "What run_dir may be" and "Checkpoints and resume".
``run_start`` decides without writing and ``prepare_run_dir`` runs only after the config validated, so a refused
config writes nothing."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from digenrl.config import Config, ConfigError, dump_config
from digenrl.safe_files import atomic_write_bytes, remove_orphans, safetensors_header

# every file or folder a run (either executor) writes into run_dir
RUN_OUTPUTS = ("config.yaml", "metrics.jsonl", "reward_curve.png", "samples_before.png", "samples_after.png",
               "checkpoint.safetensors", "summary.json", "trace.json", "gantt.png", "trajectories.jsonl",
               "profile.json", "profile_observed.json", "failure.json", "tensorboard", "checkpoints",
               "guard_pre_divergence.safetensors", "logs", "samples", "wandb")
MARKER = ".digenrl-run"  # JSON {"program": "digenrl", "outputs": [...]}: this directory is a run of this program
LOCK = ".digenrl-lock"  # flock-ed by the process writing the run (its pid inside)
_OWN = (MARKER, LOCK)
# what a resumed run writes again from scratch (the rest is kept: config is rewritten, metrics truncated)
REDONE_ON_RESUME = ("summary.json", "failure.json", "samples_after.png", "reward_curve.png", "trace.json",
                    "gantt.png", "trajectories.jsonl", "checkpoint.safetensors", "profile_observed.json")


@dataclass(frozen=True)
class RunStart:
    """How a run uses its ``run_dir``: a fresh one, replacing a previous run, or resuming from ``checkpoint``."""

    run_dir: Path
    kind: Literal["fresh", "overwrite", "resume"]
    checkpoint: Path | None = None
    step: int = 0  # committed steps of the checkpoint


def marked_outputs(run_dir: str | Path) -> list[str] | None:
    """The outputs the marker of ``run_dir`` says this program writes there (None: no valid marker)."""
    try:
        meta = json.loads((Path(run_dir) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("program") != "digenrl" or not isinstance(meta.get("outputs"), list):
        return None
    return [n for n in meta["outputs"] if n in RUN_OUTPUTS]  # names only: a hand-edited marker deletes no more


def _check_ours(d: Path) -> None:
    """``ConfigError`` unless ``d`` is empty or marked as a run of this program (before deleting anything)."""
    if marked_outputs(d) is not None:
        return
    held = sorted(n for n in os.listdir(d) if n not in _OWN) if d.is_dir() else []  # besides marker and lock
    if held:
        raise ConfigError(f"run_dir: {str(d)!r} holds files this program did not mark as its run ({', '.join(held[:4])}"
                          f"{', ...' if len(held) > 4 else ''}; no {MARKER} marker), so it deletes none of them: "
                          "choose another run_dir, or empty it yourself")


def run_start(cfg: Config, *, resume: bool = False, overwrite: bool = False) -> RunStart:
    """Decide (without writing) how this run uses ``cfg.run_dir``; ``ConfigError`` if it may not."""
    from digenrl.train.checkpoint import latest_checkpoint, list_checkpoints, verify_checkpoint
    from digenrl.train.resume_config import check_resume_config

    d = Path(cfg.run_dir)
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite exclude each other")
    prev = [n for n in RUN_OUTPUTS if (d / n).exists()]  # the outputs of a previous run there
    if resume or (cfg.resume == "auto" and not overwrite):
        ckpt = latest_checkpoint(d)
        if ckpt is not None:
            try:
                state_cfg, step = _checkpoint_config(ckpt)
            except ValueError as e:
                raise ConfigError(f"resume: {e}") from None
            check_resume_config(state_cfg, cfg)
            if step > cfg.steps:
                raise ConfigError(f"steps: {cfg.steps} is below the {step} steps of the checkpoint {str(ckpt)!r}")
            return RunStart(d, "resume", ckpt, step)
        if resume:
            found = [p for _, p in list_checkpoints(d)]  # each damaged one was skipped with a warning; the newest
            why = f"; the newest, {found[-1].name}, does not verify: {verify_checkpoint(found[-1])}" if found else ""
            raise ConfigError(f"--resume: {str(d)!r} holds no resumable checkpoint (checkpoints/step_*.safetensors)"
                              + (why or ("" if prev else "; it holds no run at all")))
        if prev:  # resume=auto, killed before its first checkpoint: start over only the same, unfinished run
            if (d / "summary.json").is_file():
                raise ConfigError(f"resume=auto: {str(d)!r} holds a finished run without a resumable checkpoint; "
                                  "use --overwrite to replace it or choose another run_dir")
            _check_ours(d)
            saved = d / "config.yaml"
            if saved.is_file():
                from digenrl.config import safe_yaml_load

                check_resume_config(safe_yaml_load(saved.read_text()) or {}, cfg, f"config file {str(saved)!r}")
            return RunStart(d, "overwrite")
    if prev and not overwrite:
        raise ConfigError(f"run_dir: {str(d)!r} already holds a run ({', '.join(prev[:4])}...); continue it with "
                          f"`digenrl train --resume {d}`, replace it with --overwrite, or choose another run_dir")
    if overwrite:
        _check_ours(d)
    return RunStart(d, "overwrite" if prev else "fresh")


def _checkpoint_config(path: Path) -> tuple[dict, int]:
    from digenrl.train.checkpoint import META_KEY

    meta = json.loads(safetensors_header(path)["__metadata__"][META_KEY])
    return meta["config"], int(meta["step"])


def clear_previous_run(run_dir: str | Path, names=RUN_OUTPUTS) -> None:
    """Delete the outputs ``names`` of the run in ``run_dir``: only those its marker names, and nothing in an
    unmarked directory that holds anything (``ConfigError``)."""
    d = Path(run_dir)
    _check_ours(d)
    ours = set(marked_outputs(d) or ())
    for n in names:
        if n not in ours:
            continue
        if (d / n).exists() or (d / n).is_symlink():
            _remove(d / n)


def kept_metrics(run_dir: str | Path, step: int) -> list[dict]:
    """The metrics rows of a run up to committed ``step`` (what a resume from that checkpoint keeps)."""
    f = Path(run_dir) / "metrics.jsonl"
    rows = []
    if f.is_file():
        for line in f.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line torn by a kill
                continue
            if int(row.get("step", 0)) <= step and not row.get("final"):
                rows.append(row)
    return rows


_HELD: dict[str, list] = {}  # resolved run_dir -> [lock fd, holds]: re-entrant within this process


def lock_run_dir(run_dir: str | Path) -> Path:
    """Create ``run_dir`` if needed and take its exclusive lock for this process (re-entrant: release it as
    often as it was taken, ``unlock_run_dir``); ``ConfigError`` naming ``run_dir`` if another process holds it."""
    from digenrl.validate import check_run_dir

    check_run_dir(str(run_dir))  # never the current, home or root directory, whoever calls
    d = Path(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    key = str(d.resolve())
    if key in _HELD:
        _HELD[key][1] += 1
        return d
    fd = os.open(d / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # BlockingIOError: another process writes this run
        holder = os.read(fd, 64).decode(errors="replace").strip()
        os.close(fd)
        who = f"process {holder}" if holder.isdigit() else "another process"
        raise ConfigError(f"run_dir: {str(d)!r} is in use by another digenrl run ({who} holds {LOCK}); wait for it "
                          "to end or choose another run_dir") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _HELD[key] = [fd, 1]
    return d


def unlock_run_dir(run_dir: str | Path) -> None:
    """Release one hold of ``lock_run_dir``; the lock goes with the last one (or when the process dies)."""
    key = str(Path(run_dir).resolve())
    held = _HELD.get(key)
    if held is None:
        return
    held[1] -= 1
    if held[1] <= 0:
        del _HELD[key]
        os.ftruncate(held[0], 0)
        fcntl.flock(held[0], fcntl.LOCK_UN)
        os.close(held[0])


def discard_unstarted(run_dir: str | Path) -> bool:
    """Remove ``run_dir`` made by a run that never started (no metrics row, no checkpoint: it failed before its
    first eval); only the outputs its marker names, the marker and the lock, and only if nothing else is in it.
    Returns whether it was removed."""
    d = Path(run_dir)
    if not d.is_dir() or (d / "checkpoints").is_dir() or (d / "checkpoint.safetensors").exists():
        return False
    metrics = d / "metrics.jsonl"
    if metrics.is_file() and metrics.read_text().strip():
        return False
    ours = set(marked_outputs(d) or ()) | set(_OWN)
    if marked_outputs(d) is None and {p.name for p in d.iterdir()} - {LOCK}:
        return False  # unmarked and holding something: not ours to delete
    if any(p.name not in ours for p in d.iterdir()):
        return False
    for p in d.iterdir():
        _remove(p)
    d.rmdir()
    return True


def _remove(p: Path) -> None:
    """Delete the file, link or directory tree ``p`` (a link itself, never what it points to)."""
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    else:
        p.unlink()


def write_marker(run_dir: str | Path) -> None:
    """Mark ``run_dir`` as a run of this program (kept when the directory already has a valid marker)."""
    from digenrl import __version__
    d = Path(run_dir)
    if marked_outputs(d) is None:
        meta = {"program": "digenrl", "version": __version__, "outputs": list(RUN_OUTPUTS),
                "note": "written by digenrl train: `--overwrite` deletes only these outputs, in a directory with this file"}
        atomic_write_bytes(d / MARKER, json.dumps(meta, indent=1).encode())


def prepare_run_dir(cfg: Config, start: RunStart | None = None) -> Path:
    """Create ``run_dir`` for ``start`` (default: a fresh run), mark it and write the resolved config."""
    run_dir = Path(cfg.run_dir)
    if start is not None and start.kind == "overwrite":
        clear_previous_run(run_dir)
    elif start is not None and start.kind == "resume":
        if marked_outputs(run_dir) is None:  # a run of a version before the marker: its checkpoints say it is ours
            write_marker(run_dir)
        clear_previous_run(run_dir, REDONE_ON_RESUME)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_marker(run_dir)
    remove_orphans(run_dir)  # temp files of a writer that was killed
    dump_config(cfg, run_dir / "config.yaml")
    return run_dir
