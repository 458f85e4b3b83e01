"""What the controller does between steps, off the schedule: the control loop's observer (``control.loop.Observer``).

* every completion goes to ``step_metrics.StepMetrics``; each step's row is written once its step is published,
  in step order (with its eval reward, the restarts and, TAG modes, the online cost factors BTS planned it
  with), and moves the progress bar (``log.progress``);
* after a step's final commit, on trainer rank 0: an eval every ``eval.every`` steps and a resumable checkpoint
  every ``runtime.checkpoint_every`` steps, as side calls (``WorkerExecutor.side``: the schedule goes on; the row
  waits for its eval). With ``eval.guard`` the eval is waited for at once: the guard scores it
  (``observe.hacking_guard``) and may end the run after this step (``GuardStopped``);
* an in-process stop request (``train.interrupt.StopRequest``) is honoured at the step boundary: a resumable
  checkpoint of the step, then ``Interrupted``.

At a final commit no action of the next step has been launched yet, so rank 0 holds that step's weights: what
the eval, the guard and the checkpoint read."""

from __future__ import annotations

from digenrl.control.loop import Completion
from digenrl.schedule import Commit
from digenrl.train import checkpoint as ckpt


class GuardStopped(Exception):
    """``eval.guard_action=stop`` tripped at the eval after ``version`` steps (its reward and samples)."""

    def __init__(self, version: int, reward: float, batch):
        self.version, self.reward, self.batch = version, reward, batch
        super().__init__(f"stopped by eval.guard after step {version}")


class BetweenSteps:
    """The observer of one attempt of ``ctl`` (``driver._Controller``) on executor ``ex``."""

    def __init__(self, ctl, ex):
        from tqdm import tqdm

        self.ctl, self.ex = ctl, ex
        self._evals: dict[int, float | None] = {}   # version -> eval reward (None: requested, not back yet)
        self._extra: dict[int, dict] = {}           # version -> more of its row (the guard's values)
        self._rows: list[dict] = []
        cfg = ctl.cfg
        self.bar = tqdm(total=cfg.steps, initial=ctl.metrics.logged, desc="train", disable=not cfg.log.progress)

    def on_completion(self, c: Completion) -> None:
        ctl = self.ctl
        ctl.metrics.record(c)
        if c.side == "eval":
            reward, sample = c.results[0].value  # sample: the grid's eval samples (run_dir/samples/)
            self._evals[c.step] = reward
            ctl.out.eval_grid(c.step, reward, sample)
        elif c.side == "checkpoint":
            ctl._save_state(c.step, c.results[0].value)
        elif isinstance(c.action, Commit) and c.action.final:
            self._after_commit(c.action.step + 1)

    def _after_commit(self, version: int) -> None:
        ctl = self.ctl
        cfg, pools, stop = ctl.cfg, ctl.pools, ctl.stop
        if version <= ctl.metrics.logged:  # a replayed step: its eval is in the metrics already
            return
        stopping = stop is not None and stop.requested and not stop.abandon  # (in-process: stop after this step)
        if cfg.eval.every and version % cfg.eval.every == 0 and version < cfg.steps:
            if cfg.eval.guard or stopping:
                self._eval_now(version)
            else:
                self._evals[version] = None
                self.ex.side(pools.on_rank0("evaluate", cfg.eval.grid_prompts), "eval", version)  # run_dir/samples/
        if stopping:
            self._end_with(version)
            path = ctl._save_state(version) if version > ctl._last_checkpoint() else ckpt.latest_checkpoint(ctl.out.run_dir)
            stop.check(version, path)
        if ckpt.due(version, cfg.runtime.checkpoint_every) and version < cfg.steps:
            self.ex.side(pools.on_rank0("pack_state", version, ctl.counters_now()), "checkpoint", version)

    def _eval_now(self, version: int) -> None:
        """The eval after ``version`` steps, waited for: its grid, and with ``eval.guard`` every sample scored by
        the guard; a trip with ``eval.guard_action=stop`` ends the run after this step (its row and a resumable
        checkpoint first)."""
        ctl = self.ctl
        reward, batch = ctl.evaluate()
        self._evals[version] = reward
        ctl.out.eval_grid(version, reward, batch)
        self._extra[version] = ctl.out.guard_eval(version, reward, batch, lambda: ctl.eval_weights(version))
        if ctl.out.guard_stop is None:
            return
        self._end_with(version)
        ctl._save_state(version)
        raise GuardStopped(version, reward, batch)

    def _end_with(self, version: int) -> None:
        """The run ends after ``version`` steps: that step's row now (it is never published)."""
        ctl = self.ctl
        ctl.metrics.steps[version - 1].published = ctl.clock.now()
        self.after_wait()

    def after_wait(self) -> None:
        """Write rows in step order; a row whose eval is still running waits for it."""
        ctl = self.ctl
        self._rows.extend(ctl.metrics.rows_ready(ctl.timeline.spans))
        while self._rows:
            row = self._rows[0]
            step = row["step"]
            if step in self._evals:
                if self._evals[step] is None:
                    return
                row["eval_reward"] = self._evals.pop(step)
            row.update(self._extra.pop(step, {}))
            row["restarts"] = len(ctl.recoveries)
            if 1 <= step <= len(ctl.sched.stats):  # row k + 1: the online cost factors BTS planned step k with
                row.update({f"cost_scale/{k}": v for k, v in ctl.sched.stats[step - 1].cost_scales.items()})
            ctl.out.log(self._rows.pop(0))
            postfix = {"reward": f"{row['reward_mean']:.3f}", "sps": f"{row.get('samples_per_s', 0.0):.0f}"}
            if "eval_reward" in row:
                postfix["eval"] = f"{row['eval_reward']:.3f}"
            self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
