"""The run outputs of a runtime run: those of ``train.loop.run_training`` plus trace, Gantt and audit.

``run_dir`` gets: config.yaml, metrics.jsonl (one row per step, reference keys + runtime metrics, eval rows),
reward_curve.png, samples_before.png / samples_after.png, checkpoint.safetensors (written atomically: tmp
file + rename, so a crash never leaves a torn checkpoint), summary.json, and from the runtime trace.json
(Chrome trace, Perfetto), gantt.png (one row per worker), trajectories.jsonl (version per trajectory),
profile.json (the measured costs BTS used, TAG modes) and, when a worker failed, failure.json.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from digenrl.config import Config

from .errors import WorkerFailure
from .executor import Call
from .records import RunRecorder, idle_share, with_idle


def write_atomic(path: Path, data: bytes) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


class RunOutputs:
    def __init__(self, cfg: Config):
        from digenrl.observe.metrics import MetricsWriter
        from digenrl.observe.run_outputs import prepare_run_dir

        self.cfg = cfg
        self.run_dir = prepare_run_dir(cfg)
        self.writer = MetricsWriter(self.run_dir, tensorboard=cfg.log.tensorboard, wandb=cfg.log.wandb,
                                    wandb_project=cfg.log.wandb_project, config=cfg.model_dump(mode="json"))
        self.eval0 = float("nan")
        self._evals: dict[int, float | None] = {}   # version -> eval reward (None: requested, not back yet)
        self._rows: list[dict] = []

    # ---- during the run ------------------------------------------------------------------------------
    def _eval(self, pools, name: str, title: str) -> float:
        from digenrl.observe.run_outputs import write_grid

        from .cluster import get_named

        res = get_named({next(iter(pools.trainers)): pools.rank0.evaluate.remote(self.cfg.eval.grid_prompts)},
                         "eval")[0]
        reward, batch = res.value
        write_grid(self.run_dir, name, batch, self.cfg.eval.grid_prompts, f"{title} (eval reward {reward:.3f})")
        return reward

    def eval_before(self, pools) -> None:
        self.eval0 = self._eval(pools, "samples_before.png", "before RL")
        self.writer.log({"step": 0, "eval_reward": self.eval0})

    def expect_eval(self, version: int) -> None:
        self._evals[version] = None

    def side_result(self, call: Call) -> None:
        if call.action is not None or not call.results:
            return
        if call.what == "eval":
            self._evals[call.step] = call.results[0].value[0]
        elif call.what == "checkpoint":
            write_atomic(self.run_dir / "checkpoint.safetensors", call.results[0].value)

    def log_rows(self, rows: list[dict]) -> None:
        """Write rows in step order; a row whose eval is still running waits for it."""
        self._rows.extend(rows)
        while self._rows:
            step = self._rows[0]["step"]
            if step in self._evals:
                if self._evals[step] is None:
                    return
                self._rows[0]["eval_reward"] = self._evals.pop(step)
            self.writer.log(self._rows.pop(0))

    def failure(self, e: WorkerFailure) -> None:
        (self.run_dir / "failure.json").write_text(json.dumps(
            {"worker": e.worker, "step": e.step, "action": e.action, "error": str(e)}, indent=2))

    def close(self) -> None:
        self.writer.close()

    # ---- at the end ----------------------------------------------------------------------------------
    def finish(self, setup, pools, sched, rec: RunRecorder, wall: float) -> dict:
        from digenrl.observe.run_outputs import finish_run
        from digenrl.schedule.audit import audit

        from .cluster import get_named

        cfg, plan = self.cfg, setup.plan
        eval1 = self._eval(pools, "samples_after.png", f"after {cfg.steps} RL steps") if cfg.steps else self.eval0
        self.writer.log({"step": cfg.steps, "eval_reward": eval1, "final": True})
        meta = {"steps": str(cfg.steps), "version": str(sched.published)}
        ckpt = get_named({next(iter(pools.trainers)): pools.rank0.checkpoint_bytes.remote(meta)}, "checkpoint")[0]
        write_atomic(self.run_dir / "checkpoint.safetensors", ckpt.value)
        violations = audit(plan, rec.log, rec.events)
        summary = {"eval_reward_initial": self.eval0, "eval_reward_final": eval1, "steps": cfg.steps,
                   "wall_s": wall, "samples_per_s": plan.batch * cfg.steps / wall if wall > 0 else 0.0,
                   "mode": cfg.runtime.mode, "version": sched.published,
                   **run_timing(rec, wall), "audit_violations": violations[:20],
                   "bts": sched.bts_stats.summary() if sched.bts_stats else None}
        self._views(rec, wall)
        finish_run(self.run_dir, self.writer.rows, summary,
                   title=f"{cfg.task.name} ({cfg.runtime.mode}): eval {self.eval0:.3f} -> {eval1:.3f}")
        return summary

    def _views(self, rec: RunRecorder, wall: float) -> None:
        from digenrl.observe.gantt import plot_gantt
        from digenrl.observe.trace import write_chrome_trace

        plan = rec.plan
        workers = list(plan.generators) + list(plan.trainers)
        spans = with_idle(rec.spans, workers, wall, rec.pool)
        write_chrome_trace(spans, self.run_dir / "trace.json", workers)
        ng, nt = len(plan.generators), len(plan.trainers)
        pools = (f"{ng} generator{'s' * (ng != 1)} + {nt} trainer rank{'s' * (nt != 1)}" if ng else
                 f"{nt} colocated worker{'s' * (nt != 1)}")
        plot_gantt(spans, self.run_dir / "gantt.png", f"{self.cfg.runtime.mode}: {pools}, {plan.steps} steps "
                   f"(measured)", workers)


def run_timing(rec: RunRecorder, wall: float) -> dict:
    """Step time, idle shares, efficiency (busy time / workers / time) over the run and in steady state."""
    plan = rec.plan
    pubs = [rec.steps[k].published for k in range(plan.steps)]
    workers = list(plan.generators) + list(plan.trainers)
    out = {"step_time_s": wall / plan.steps if plan.steps else 0.0,
           "efficiency": 1.0 - idle_share(rec.spans, workers, 0.0, wall)}
    for pool, ws in rec.pools().items():
        out[f"idle/{pool}"] = idle_share(rec.spans, ws, 0.0, wall)
    if plan.steps >= 3 and all(p is not None for p in pubs):  # from the first publish on: no pipeline fill
        t0, t1 = pubs[0], pubs[-1]
        out["steady_step_time_s"] = (t1 - t0) / (plan.steps - 1)
        out["steady_efficiency"] = 1.0 - idle_share(rec.spans, workers, t0, t1)
    st = [rec.steps[k] for k in range(plan.steps)]
    out["tag_fragments_per_step"] = sum(s.tag_fragments for s in st) / max(1, len(st))
    versions = [(k, v) for k, s in enumerate(st) for v in s.versions]
    out["stale_fraction"] = sum(1 for k, v in versions if v == k - 1) / max(1, len(versions))
    return out
