"""Per-step metrics of a run, and the version of every trajectory, from the control loop's completions.

The one ``StepMetrics`` of every run. A row has ``reward_mean``, ``reward_std``, ``reward/<part>``, the loss
statistics (``train.chunk_loss.CellStats``: ``loss``, ``approx_kl``, ``clipfrac*``, ``kl``, ``mismatch/*``),
``cells``, ``kept_fraction`` (the share of the step's B trajectories that count in its first epoch's means:
``train.filter_zero_advantage``, ``zero_adv_refill``, ``best_of_n``), ``grad_norm`` (mean over the step's
commits), ``zero_std_ratio``, and:

* ``timing_s/gen`` / ``timing_s/train``: wall spans of the step's generation / training (first start to last
  end; they overlap in pipelined modes), ``busy_s/*`` the summed busy seconds, ``timing_s/commit`` /
  ``timing_s/publish``, ``step_s`` the time between this step's publish and the previous one (run start for
  step 1); ``idle/<pool>``: idle share of each pool in the step's window;
* ``tag_fragments``, ``stale_fraction``, ``staleness/0`` / ``staleness/1`` (trajectories of the step's own
  version / the previous one), ``version_min`` / ``version_max``;
* TAG modes with ``tuning.bts.online``: ``cost_scale/<kind>`` (``between_steps``).

``trajectories.jsonl`` holds one line per trajectory (step, uid, generation, version, worker, reward); its
``step`` N (from 1: ``schedule.step_number``) is metrics.jsonl's (row 0 is the eval before RL), and ``version``
the policy version that generated it (0: the initial weights): N - 1 on-policy, N - 2 stale (TCSS)."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from digenrl.control.loop import Completion
from digenrl.control.timeline import idle_share, pools_of, rank_busy
from digenrl.safe_files import naming
from digenrl.schedule import Commit, Generate, Publish, StepPlan, Train, step_number
from digenrl.train.chunk_loss import CellStats


@dataclass
class _Window:
    start: float = float("inf")
    end: float = 0.0
    busy: float = 0.0

    def add(self, start: float, end: float) -> None:
        self.start, self.end, self.busy = min(self.start, start), max(self.end, end), self.busy + end - start

    @property
    def span(self) -> float:
        return max(0.0, self.end - self.start)


@dataclass
class StepRecord:
    rewards: dict = field(default_factory=dict)        # (group, generation) -> reward
    parts: dict = field(default_factory=lambda: defaultdict(list))
    versions: list = field(default_factory=list)
    gen: _Window = field(default_factory=_Window)
    train: _Window = field(default_factory=_Window)
    stats: CellStats = field(default_factory=CellStats)
    tag_fragments: int = 0
    grad_norms: list = field(default_factory=list)   # one per commit (round) of the step
    kept: int = 0                                    # trajectories counted by the first epoch's rounds
    commit_s: float = 0.0
    publish_s: float = 0.0
    published: float | None = None


class StepMetrics:
    def __init__(self, plan: StepPlan, run_dir: Path | None = None):
        self.plan = plan
        self.steps = defaultdict(StepRecord)
        self._traj = (run_dir / "trajectories.jsonl").open("w") if run_dir is not None else None
        self.logged = 0  # steps whose rows were handed out (a resumed run starts past the kept ones)
        self.attempt = 0
        self._t0 = 0.0  # when the current attempt started (the step before its first has no publish time here)

    def replay_from(self, step: int, attempt: int, t0: float) -> None:
        """A (re)started attempt runs from ``step`` at time ``t0``: forget what a failed attempt recorded from
        there on."""
        self.attempt, self._t0 = attempt, t0
        for k in [k for k in self.steps if k >= step]:
            del self.steps[k]
        for k in range(self.logged, step):  # committed (the checkpoint holds it) but its row not out yet (TCSS:
            if k in self.steps and self.steps[k].published is None:  # a failure before its publish): its version
                self.steps[k].published = t0  # reached the workers with the restarted pools; its row comes next
        while self.logged < step and self.logged not in self.steps:  # a resumed run: rows up to it are kept
            self.logged += 1

    def record(self, c: Completion) -> None:
        a = c.action
        if a is None:  # a side call (eval / checkpoint)
            return
        st = self.steps[a.step]
        if isinstance(a, Generate):
            for w in c.work:
                st.gen.add(w.start, w.end)
            st.tag_fragments += int(a.tag)
            for f, info in zip(a.fragments, c.results):  # one merged info per part (a gang over groups: several)
                for i, r in zip(f.generations, info.rewards):
                    st.rewards[(f.group, i)] = r
                    st.versions.append(info.version)
                    if self._traj is not None:
                        with naming(self._traj.name):  # a full disk: the error names trajectories.jsonl
                            self._traj.write(json.dumps({"step": step_number(f.step), "uid": info.uid, "generation": i,
                                                         "version": info.version, "worker": a.worker, "tag": a.tag,
                                                         "fragment": list(f.generations), "reward": r,
                                                         "attempt": self.attempt}) + "\n")
                for k, v in info.reward_parts.items():
                    st.parts[k].extend(v)
        elif isinstance(a, Train):
            for w in c.work:
                st.train.add(w.start, w.end)
            st.stats = st.stats.add(c.results[0].stats)
        elif isinstance(a, Commit):
            st.grad_norms.append(c.results[0].grad_norm)  # rank 0's (the results are in launch order)
            if a.round < self.plan.minibatches:  # the first epoch's rounds count each kept sample once
                st.kept += c.results[0].kept
            for r in c.results:  # a deferred round's loss statistics come with its commit, per rank
                if r.stats is not None:
                    st.stats = st.stats.add(r.stats)
            st.commit_s += c.end - c.start
        elif isinstance(a, Publish):
            st.publish_s, st.published = c.end - c.start, c.end

    def rows_ready(self, spans) -> list[dict]:
        """Rows of the steps published since the last call, in step order (``spans``: the run's so far)."""
        out = []
        while self.logged < self.plan.steps and self.steps[self.logged].published is not None:
            out.append(self.row(self.logged, spans))
            self.logged += 1
        return out

    def row(self, k: int, spans) -> dict:
        import torch

        from digenrl.algo.advantage import group_advantages

        st, p = self.steps[k], self.plan
        keys = sorted(st.rewards)
        r = torch.tensor([st.rewards[key] for key in keys], dtype=torch.float32)
        _, adv_stats = group_advantages(r, torch.tensor([g for g, _ in keys]), adv_clip_max=1e9)
        prev = self.steps[k - 1].published if k > 0 and k - 1 in self.steps else None
        prev = self._t0 if prev is None else prev
        step_s = st.published - prev
        stale = sum(1 for v in st.versions if v == k - 1)
        row = {"step": step_number(k), "reward_mean": float(r.mean()), "reward_std": float(r.std(unbiased=False))}
        row.update({f"reward/{n}": float(torch.tensor(v).mean()) for n, v in st.parts.items()})
        row.update(st.stats.means())
        row.update({
            "grad_norm": sum(st.grad_norms) / max(1, len(st.grad_norms)), "zero_std_ratio": adv_stats.zero_std_ratio,
            "cells": st.stats.cells, "kept_fraction": st.kept / p.batch,
            "timing_s/gen": st.gen.span, "timing_s/train": st.train.span,
            "timing_s/commit": st.commit_s, "timing_s/publish": st.publish_s,
            "busy_s/gen": st.gen.busy, "busy_s/train": st.train.busy,
            "step_s": step_s, "samples_per_s": p.batch / step_s if step_s > 0 else 0.0,
            "tag_fragments": st.tag_fragments, "stale_fraction": stale / max(1, len(st.versions)),
            "staleness/0": sum(1 for v in st.versions if v == k), "staleness/1": stale,
            "version_min": min(st.versions), "version_max": max(st.versions),
        })
        for pool, workers in pools_of(p).items():
            row[f"idle/{pool}"] = idle_share(spans, workers, prev, st.published, rank_busy(p))
        return row

    def close(self) -> None:
        if self._traj is not None:
            with naming(self._traj.name):
                self._traj.close()
            self._traj = None
