"""What a run leaves in ``run_dir``, the same for the single-process loop and the Ray runtime: resolved config,
metrics.jsonl, reward curve, before/after sample grids, a safetensors checkpoint (the final weights), resumable
checkpoints (``checkpoints/``, ``train.checkpoint``) and summary.json.

``RunOutputs`` is the one lifecycle: ``config.yaml`` and ``metrics.jsonl`` when it is created (only after the
config validated, so a refused config writes nothing); ``before`` (eval before RL: step-0 row and
``samples_before.png``; skipped by a resumed run); ``log`` (one row per step); ``after`` (final eval row and
``samples_after.png``); ``write_checkpoint`` (``checkpoint.safetensors``, written atomically); ``finish``
(``summary.json`` and ``reward_curve.png``); ``failure`` (``failure.json``).

One run per directory: ``plan_run_dir`` (no writes) refuses a ``run_dir`` that holds a previous run unless the
run resumes it (``--resume`` / ``resume=auto``) or replaces it (``--overwrite``: the previous run's outputs are
deleted first, so the directory never mixes two runs). Resuming keeps the metrics rows up to the checkpoint's
step and drops everything written after it (the rest of metrics.jsonl, summary.json, failure.json...).
``prepare_run_dir`` is called only after the config validated, so a refused config writes nothing.

Nothing the program did not write is deleted: every run directory gets a marker, ``.digenrl-run`` (JSON: the
program and the names of the outputs it writes there), and ``--overwrite`` (or ``resume=auto`` starting over)
deletes only the outputs the marker names, and only in a marked directory: a directory without the marker that
holds anything is refused, naming it (``validate.check_run_dir`` already refuses an empty run_dir, the current
directory, the home directory and ``/``). A run holds an exclusive lock (``fcntl.flock`` on ``.digenrl-lock``
in run_dir, ``lock_run_dir``) for its whole life, so a second writer into the same run_dir is refused at once
(``ConfigError``: exit 2); the OS drops the lock when the process dies, however it dies.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from digenrl.config import Config, ConfigError, dump_config
from digenrl.observe.plots import reward_curve, sample_grid
from digenrl.safe_files import remove_orphans

# every file or folder a run (either executor) writes into run_dir
RUN_OUTPUTS = ("config.yaml", "metrics.jsonl", "reward_curve.png", "samples_before.png", "samples_after.png",
               "checkpoint.safetensors", "summary.json", "trace.json", "gantt.png", "trajectories.jsonl",
               "profile.json", "profile_observed.json", "failure.json", "tensorboard", "checkpoints",
               "guard_pre_divergence.safetensors")
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


def previous_run(run_dir: str | Path) -> list[str]:
    """The run outputs present in ``run_dir`` (empty: no previous run there)."""
    d = Path(run_dir)
    return [n for n in RUN_OUTPUTS if (d / n).exists()] if d.is_dir() else []


def marked_outputs(run_dir: str | Path) -> list[str] | None:
    """The outputs the marker of ``run_dir`` says this program writes there (None: no valid marker)."""
    try:
        meta = json.loads((Path(run_dir) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("program") != "digenrl" or not isinstance(meta.get("outputs"), list):
        return None
    return [n for n in meta["outputs"] if n in RUN_OUTPUTS]  # names only: a hand-edited marker deletes no more


def foreign_entries(run_dir: str | Path) -> list[str]:
    """What ``run_dir`` holds besides the marker and the lock (empty for a missing or empty directory)."""
    d = Path(run_dir)
    return sorted(n for n in os.listdir(d) if n not in _OWN) if d.is_dir() else []


def _check_ours(d: Path) -> None:
    """``ConfigError`` unless ``d`` is empty or marked as a run of this program (before deleting anything)."""
    if marked_outputs(d) is not None:
        return
    held = foreign_entries(d)
    if held:
        raise ConfigError(f"run_dir: {str(d)!r} holds files this program did not mark as its run ({', '.join(held[:4])}"
                          f"{', ...' if len(held) > 4 else ''}; no {MARKER} marker), so it deletes none of them: "
                          "choose another run_dir, or empty it yourself")


def plan_run_dir(cfg: Config, *, resume: bool = False, overwrite: bool = False) -> RunStart:
    """Decide (without writing) how this run uses ``cfg.run_dir``; ``ConfigError`` if it may not."""
    from digenrl.train.checkpoint import check_resume_config, latest_checkpoint

    d = Path(cfg.run_dir)
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite exclude each other")
    prev = previous_run(d)
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
            raise ConfigError(f"--resume: {str(d)!r} holds no resumable checkpoint (checkpoints/step_*.safetensors)"
                              + ("" if prev else "; it holds no run at all"))
        if prev:  # resume=auto, killed before its first checkpoint: start over only the same, unfinished run
            if (d / "summary.json").is_file():
                raise ConfigError(f"resume=auto: {str(d)!r} holds a finished run without a resumable checkpoint; "
                                  "use --overwrite to replace it or choose another run_dir")
            _check_ours(d)
            saved = d / "config.yaml"
            if saved.is_file():
                from digenrl.config import safe_yaml_load

                check_resume_config(safe_yaml_load(saved.read_text()) or {}, cfg)
            return RunStart(d, "overwrite")
    if prev and not overwrite:
        raise ConfigError(f"run_dir: {str(d)!r} already holds a run ({', '.join(prev[:4])}...); continue it with "
                          f"`digenrl train --resume {d}`, replace it with --overwrite, or choose another run_dir")
    if overwrite:
        _check_ours(d)
    return RunStart(d, "overwrite" if prev else "fresh")


def _checkpoint_config(path: Path) -> tuple[dict, int]:
    from digenrl.safe_files import safetensors_header
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
        p = d / n
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()


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
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    d.rmdir()
    return True


def write_marker(run_dir: str | Path) -> None:
    """Mark ``run_dir`` as a run of this program (kept when the directory already has a valid marker)."""
    from digenrl import __version__
    from digenrl.safe_files import atomic_write_bytes

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


def write_grid(run_dir: Path, name: str, batch, n: int, title: str) -> None:
    n = min(n, len(batch))
    scores = batch.rewards[:n].tolist() if batch.rewards is not None else None
    sample_grid(batch.images[:n], [p.text for p in batch.prompts[:n]], run_dir / name, title=title, scores=scores)


def save_checkpoint(policy, run_dir: Path, meta: dict[str, str], state: dict | None = None) -> Path:
    """The final weights as ``run_dir/checkpoint.safetensors`` (the policy's own format if it has ``save``),
    written atomically (``digenrl.safe_files``). ``state``: the tensors to write instead of the policy's own
    (a sharded pool gathers them first: the policy's ``state_dict`` with ``save``, else its trainable state)."""
    from safetensors.torch import save_file

    from digenrl.safe_files import atomic_write_with

    def write(tmp: Path) -> None:
        if hasattr(policy, "save"):
            policy.save(tmp, meta, state=state)
        else:
            tensors = state if state is not None else policy.trainable_state_dict()
            save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp), metadata=meta)

    return atomic_write_with(run_dir / "checkpoint.safetensors", write)


def checkpoint_bytes(policy, meta: dict[str, str], state: dict | None = None) -> bytes:
    """The bytes of ``save_checkpoint(policy, ...)`` (written where the run lives by ``RunOutputs``)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        return save_checkpoint(policy, Path(d), meta, state).read_bytes()


def finish_run(run_dir: Path, rows: list[dict], summary: dict[str, Any], title: str) -> None:
    reward_curve(rows, run_dir / "reward_curve.png", title=title)
    from digenrl.safe_files import atomic_write_bytes

    atomic_write_bytes(run_dir / "summary.json", json.dumps(summary, indent=2).encode())
    (run_dir / "failure.json").unlink(missing_ok=True)  # a finished run has no failure


TIE_TOL = 1e-6  # rewards closer than this count as tied (the advantage's zero_std_tol)


def no_signal(row: dict, cfg: Config) -> bool:
    """True when no sample of the step has an advantage, so nothing trains: every reward of the step ties, or
    (group baseline) every prompt group's rewards tie (``zero_std_ratio`` = 1)."""
    if row.get("reward_std", 1.0) <= TIE_TOL:
        return True
    return cfg.train.adv_baseline == "group" and row.get("zero_std_ratio", 0.0) >= 1.0 and not cfg.train.adv_per_reward


def step_line(row: dict, steps: int) -> str:
    """One line a person reads: ``step 3/200 | reward 0.512 +-0.104 (ocr 0.50, pickscore 0.31) | eval 0.610 |
    kl 0.0012 grad 0.42 | tied 25% | 1.9 s 34 samples/s``."""
    out = [f"step {row['step']}/{steps}"]
    reward = f"reward {row['reward_mean']:.3f} +-{row.get('reward_std', 0.0):.3f}"
    parts = [(k[len("reward/"):], v) for k, v in sorted(row.items())
             if k.startswith("reward/") and k.count("/") == 1 and isinstance(v, (int, float))]
    if parts:
        reward += " (" + ", ".join(f"{n} {v:.3f}" for n, v in parts) + ")"
    out.append(reward)
    if row.get("eval_reward") is not None:
        out.append(f"eval {row['eval_reward']:.3f}")
    train = [f"{name} {row[key]:.4g}" for key, name in (("loss", "loss"), ("kl", "kl"), ("approx_kl", "approx_kl"),
                                                        ("clipfrac", "clip"), ("grad_norm", "grad")) if key in row]
    if train:
        out.append(" ".join(train))
    if row.get("zero_std_ratio"):
        out.append(f"tied {100 * row['zero_std_ratio']:.0f}%")
    if row.get("restarts"):
        out.append(f"restarts {row['restarts']}")
    if "step_s" in row:
        out.append(f"{row['step_s']:.2f} s {row.get('samples_per_s', 0.0):.1f} samples/s")
    return " | ".join(out)


def _print_line(text: str, err: bool = True) -> None:
    """A line on stderr (``err``) or stdout that a tqdm bar does not overwrite."""
    import sys

    from tqdm import tqdm

    tqdm.write(text, file=sys.stderr if err else sys.stdout)


class RunOutputs:
    """The outputs of one training run (see the module docstring for the order of the calls)."""

    def __init__(self, cfg: Config, start: RunStart | None = None):
        """``start``: how the run uses ``run_dir`` (``plan_run_dir``; default a fresh run). A resumed run keeps
        the metrics rows up to its checkpoint's step."""
        from digenrl.observe.metrics import MetricsWriter

        self.cfg = cfg
        self._locked = lock_run_dir(cfg.run_dir)  # held until ``close``: one writer per run_dir
        try:
            self.run_dir = prepare_run_dir(cfg, start)
            resumed = start is not None and start.kind == "resume"
            self.writer = MetricsWriter(self.run_dir, tensorboard=cfg.log.tensorboard, wandb=cfg.log.wandb,
                                        wandb_project=cfg.log.wandb_project, config=cfg.model_dump(mode="json"),
                                        rows=kept_metrics(self.run_dir, start.step) if resumed else None)
        except BaseException:
            unlock_run_dir(self._locked)
            raise
        self.eval0 = self.eval1 = float("nan")
        self._tied = False
        self.guard = None  # observe.hacking_guard.GuardMonitor when eval.guard is set
        if cfg.eval.guard:
            from digenrl.observe.hacking_guard import GuardMonitor

            try:
                self.guard = GuardMonitor(cfg, self.run_dir)
            except BaseException:
                self.close()
                raise

    @property
    def guard_stop(self) -> dict | None:
        """The trip that ends the run (``eval.guard_action=stop``), or None."""
        return None if self.guard is None else self.guard.stop

    def guard_eval(self, step: int, reward: float, batch, weights=None, *, final: bool = False) -> dict:
        """The guard values of the eval at ``step`` (``guard/<name>``, empty without ``eval.guard``), acting on a
        trip (``observe.hacking_guard``); ``weights()``: the eval weights as checkpoint bytes (``checkpoint``)."""
        if self.guard is None:
            return {}
        row = self.guard.measure(step, batch)
        self.guard.check(step, self.eval0, reward, final=final, weights=weights)
        return row

    def mid_eval(self, step: int, reward: float, batch, weights=None) -> dict:
        """An eval between steps (``eval.every``): its sample grid to TensorBoard / wandb as ``samples/eval`` at
        ``step`` (where they are on; ``eval_grid``) and the guard values (``guard_eval``)."""
        self.eval_grid(step, reward, batch)
        return self.guard_eval(step, reward, batch, weights)

    def eval_grid(self, step: int, reward: float, batch) -> None:
        """The first ``eval.grid_prompts`` samples of a mid-run eval as the image ``samples/eval`` at ``step`` in
        TensorBoard and wandb (nothing is written to run_dir: the grid goes through a temporary file)."""
        if batch is None or not len(batch) or not self.writer.sends_images:
            return
        import tempfile

        with tempfile.TemporaryDirectory(prefix="digenrl-grid-") as tmp:
            write_grid(Path(tmp), "grid.png", batch, self.cfg.eval.grid_prompts,
                       f"after {step} RL steps (eval reward {reward:.3f})")
            self.writer.image("samples/eval", Path(tmp) / "grid.png", step)

    def counters(self) -> dict:
        """What a resumable checkpoint keeps of the outputs' state besides the eval rewards (the guard's)."""
        return {} if self.guard is None else {"guard": self.guard.state()}

    def restore(self, counters: dict) -> None:
        """A resumed run: the eval before RL and the guard's state from the checkpoint's counters."""
        self.eval0 = counters["eval0"]
        if self.guard is not None:
            if not counters.get("guard"):  # eval.guard added on resume: no base samples' state to go on from
                _print_line("digenrl: warning: eval.guard: the checkpoint holds no guard state (the run started "
                            "without eval.guard); the guards' first values and drift's base statistics are those "
                            "of the next eval, not of the base model")
            self.guard.restore(counters.get("guard"))

    def before(self, reward: float, batch, weights=None) -> None:
        """The eval before RL: step-0 row (with the guards: their first values, the base statistics) and
        ``samples_before.png``."""
        self.eval0 = reward
        write_grid(self.run_dir, "samples_before.png", batch, self.cfg.eval.grid_prompts,
                   f"before RL (eval reward {reward:.3f})")
        self.writer.log({"step": 0, "eval_reward": reward, **self.guard_eval(0, reward, batch, weights)})
        self.writer.image("samples/before", self.run_dir / "samples_before.png", 0)

    def log(self, row: dict) -> None:
        """A step's row: metrics (``no_signal`` added), the tie warning, the terminal line."""
        if "reward_mean" in row:
            row = {**row, "no_signal": float(no_signal(row, self.cfg))}
            self._warn_tied(row)
        self.writer.log(row)
        every = self.cfg.log.print_every
        if "reward_mean" in row and every and (int(row["step"]) % every == 0 or int(row["step"]) == self.cfg.steps):
            _print_line(step_line(row, self.cfg.steps), err=False)  # progress on stdout, errors alone on stderr

    def _warn_tied(self, row: dict) -> None:
        """Warn at the first step of each run of steps without a learning signal."""
        tied = row["no_signal"] > 0
        if tied and not self._tied:
            _print_line(f"digenrl: warning: step {row['step']}: every reward of the step ties "
                        f"({row['reward_mean']:.3f}){' within each prompt group' if row.get('reward_std', 0) > TIE_TOL else ''}"
                        ": no advantage, nothing trains (no_signal=1 in metrics.jsonl); a reward that scores "
                        "all samples alike (e.g. OCR at 0 before any text appears) needs a denser reward, more "
                        "generations or another prompt set")
        self._tied = tied

    def after(self, reward: float, batch, weights=None) -> None:
        """The eval after the last step: final row and ``samples_after.png``. A run ended by its guard
        (``guard_stop``) passes the eval of its last step (its guard values are not measured again)."""
        self.eval1 = reward
        stopped = self.guard_stop
        steps = self.cfg.steps if stopped is None else stopped["step"]
        guard = dict(self.guard.last) if stopped is not None else self.guard_eval(steps, reward, batch, weights, final=True)
        self.writer.log({"step": steps, "eval_reward": reward, "final": True, **guard})
        write_grid(self.run_dir, "samples_after.png", batch, self.cfg.eval.grid_prompts,
                   f"after {steps} RL steps (eval reward {reward:.3f})"
                   + (f"; stopped by guard/{stopped['guard']}" if stopped else ""))
        self.writer.image("samples/after", self.run_dir / "samples_after.png", steps)

    def write_checkpoint(self, data: bytes) -> Path:
        from digenrl.safe_files import atomic_write_bytes

        return atomic_write_bytes(self.run_dir / "checkpoint.safetensors", data)

    def finish(self, *, wall_s: float, version: int, **extra) -> dict:
        """``summary.json`` (eval before/after, steps, wall time, throughput, mode, version, ``extra``) and
        ``reward_curve.png``; returns the summary."""
        cfg = self.cfg
        done = cfg.steps if self.guard_stop is None else self.guard_stop["step"]
        samples = cfg.train.prompts_per_step * cfg.train.generations * done
        summary = {"eval_reward_initial": self.eval0, "eval_reward_final": self.eval1, "steps": cfg.steps,
                   "wall_s": wall_s, "samples_per_s": samples / wall_s if wall_s > 0 else 0.0,
                   "mode": cfg.runtime.mode, "version": version, **extra}
        if self.guard is not None:
            summary.update(self.guard.summary())
            if self.guard_stop is not None:
                summary["steps_done"] = done
        finish_run(self.run_dir, self.writer.rows, summary,
                   title=f"{cfg.task.name} ({cfg.runtime.mode}): eval {self.eval0:.3f} -> {self.eval1:.3f}")
        return summary

    def failure(self, record: dict) -> None:
        from digenrl.safe_files import atomic_write_bytes

        atomic_write_bytes(self.run_dir / "failure.json", json.dumps(record, indent=2).encode())

    def close(self) -> None:
        try:
            self.writer.close()
        finally:
            if self._locked is not None:
                unlock_run_dir(self._locked)
                self._locked = None
