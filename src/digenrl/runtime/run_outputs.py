"""What a run leaves in ``run_dir``, the same for every run (in-process or on Ray).

``RunOutputs`` is the one lifecycle: ``config.yaml`` and ``metrics.jsonl`` when it is created (only after the
config validated, so a refused config writes nothing); ``before`` (eval before RL: step-0 row and
``samples_before.png``; skipped by a resumed run); ``log`` (one row per step); ``after`` (final eval row and
``samples_after.png``); ``write_checkpoint`` (``checkpoint.safetensors``, atomically); ``finish``
(``summary.json`` and ``reward_curve.png``). ``write_failure`` (``failure.json``, ``FailureRecord``) is the one
writer of a stopped run's record. The run directory itself (marker, lock, resume) is ``runtime.run_dir``'s."""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from digenrl.config import Config
from digenrl.observe.plots import reward_curve, sample_grid
from digenrl.observe.progress import line as _print_line
from digenrl.runtime.run_dir import RunStart, kept_metrics, lock_run_dir, prepare_run_dir, unlock_run_dir
from digenrl.safe_files import atomic_write_bytes, atomic_write_with


def write_grid(run_dir: Path, name: str, batch, n: int, title: str) -> None:
    n = min(n, len(batch))
    scores = batch.rewards[:n].tolist() if batch.rewards is not None else None
    sample_grid(batch.images[:n], [p.text for p in batch.prompts[:n]], run_dir / name, title=title, scores=scores)


def save_checkpoint(policy, run_dir: Path, meta: dict[str, str], state: dict | None = None) -> Path:
    """The final weights as ``run_dir/checkpoint.safetensors`` (the policy's own format if it has ``save``),
    written atomically (``digenrl.safe_files``). ``state``: the tensors to write instead of the policy's own
    (a sharded pool gathers them first: the policy's ``state_dict`` with ``save``, else its trainable state)."""
    from safetensors.torch import save_file

    def write(tmp: Path) -> None:
        if hasattr(policy, "save"):
            policy.save(tmp, meta, state=state)
        else:
            tensors = state if state is not None else policy.trainable_state_dict()
            save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp), metadata=meta)

    return atomic_write_with(run_dir / "checkpoint.safetensors", write)


def checkpoint_bytes(policy, meta: dict[str, str], state: dict | None = None) -> bytes:
    """The bytes of ``save_checkpoint(policy, ...)`` (written where the run lives by ``RunOutputs``)."""
    with tempfile.TemporaryDirectory() as d:
        return save_checkpoint(policy, Path(d), meta, state).read_bytes()


@dataclass(frozen=True)
class FailureRecord:
    """``failure.json``: why a run stopped before its end, one schema for every cause (every key present).

    ``kind``: ``worker`` (a worker failed, restarts exhausted or not worth it), ``halted`` (a non-finite value or
    a reward that raised: ``faults.RunHalted``), ``interrupted`` (a stop signal), ``io`` (the run could not write
    its outputs). ``error``: one line. ``step``: the step ``error`` names, numbered from 1 as the progress line
    (``step 3/200``) and ``metrics.jsonl`` (``schedule.step_number``): the one whose work failed (``worker``), or
    the last one done before a stop (``interrupted``: ``checkpoint`` holds that many steps, ``--resume`` runs the
    next); None where not known. (A ``worker`` record's ``step`` counted from 0 before the numbers were unified:
    it is one more now.) ``worker`` /
    ``action``: who failed doing what; ``signal``, ``errno``: of a stop or an I/O error; ``restarts``: worker
    failures recovered before; ``deterministic``: a restart would meet the error again; ``checkpoint``: the newest
    resumable checkpoint (None: none); ``resume``: the command that continues the run from it."""

    kind: str
    error: str
    step: int | None = None
    worker: str | None = None
    action: str | None = None
    signal: str | None = None
    errno: int | None = None
    restarts: int = 0
    deterministic: bool | None = None
    checkpoint: str | None = None
    resume: str | None = None


def write_failure(run_dir: Path, record: FailureRecord) -> None:
    """Write ``run_dir/failure.json`` atomically (nothing where the run dir is gone); a ``checkpoint`` path is
    written as text."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return
    record = replace(record, checkpoint=None if record.checkpoint is None else str(record.checkpoint))
    atomic_write_bytes(run_dir / "failure.json", json.dumps(asdict(record), indent=2).encode())


def resume_command(run_dir) -> str:
    """How a stopped run goes on (``failure.json``'s ``resume``, the CLI's last line)."""
    return f"digenrl train --resume {run_dir}"


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


class RunOutputs:
    """The outputs of one training run (see the module docstring for the order of the calls)."""

    def __init__(self, cfg: Config, start: RunStart | None = None):
        """``start``: how the run uses ``run_dir`` (``run_start``; default a fresh run). A resumed run keeps
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

    def eval_grid(self, step: int, reward: float, batch) -> None:
        """The first ``eval.grid_prompts`` samples of a mid-run eval as ``run_dir/samples/eval_step_<step>.png``,
        and as the image ``samples/eval`` at ``step`` in TensorBoard and wandb where they are on."""
        if batch is None or not len(batch):
            return
        out = self.run_dir / "samples" / f"eval_step_{step}.png"
        out.parent.mkdir(exist_ok=True)
        write_grid(out.parent, out.name, batch, self.cfg.eval.grid_prompts,
                   f"after {step} RL steps (eval reward {reward:.3f})")
        if self.writer.sends_images:
            self.writer.image("samples/eval", out, step)

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
        reward_curve(self.writer.rows, self.run_dir / "reward_curve.png",
                     title=f"{cfg.task.name} ({cfg.runtime.mode}): eval {self.eval0:.3f} -> {self.eval1:.3f}")
        atomic_write_bytes(self.run_dir / "summary.json", json.dumps(summary, indent=2).encode())
        (self.run_dir / "failure.json").unlink(missing_ok=True)  # a finished run has no failure
        return summary

    def close(self) -> None:
        try:
            self.writer.close()
        finally:
            if self._locked is not None:
                unlock_run_dir(self._locked)
                self._locked = None
