"""What generator and trainer actors share: config, threads, the step's prompts, fragment generation.

A fragment (step, group, generation indices) is generated the same on every worker, in any batch: same prompts (``task.train_prompts(step, P, seed)[group]``), same timestep plan of the step,
same per-trajectory noise (I5), so any worker produces identical samples. The decoded images are scored on
the worker and dropped before the trajectories go to the object store (trainers need latents and log-probs).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from digenrl.config import Config
from digenrl.control.run_plan import TestHooks, timestep_plan
from digenrl.schedule import step_number
from digenrl.train.memory_check import SAMPLE_BATCH

from .messages import FragmentInfo
from .timing import Calibration


def capture_output(path: str, name: str) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2: Python, C extensions and Ray's own worker
    logging alike) to ``path``, appended (a restarted worker continues its file), line-buffered."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)
        except (AttributeError, ValueError):  # a stream replaced by something else: flushed on its own
            pass
    print(f"[digenrl] worker {name} (pid {os.getpid()}) started {datetime.now().isoformat(timespec='seconds')}",
          flush=True)


def log_tail(path: str | Path, lines: int = 20) -> list[str]:
    """The last ``lines`` lines of a worker's log (empty when there is none)."""
    try:
        data = Path(path).read_bytes()[-64 * 1024:]
    except OSError:
        return []
    return data.decode("utf-8", "replace").splitlines()[-lines:]


def fetch(refs) -> list:
    """The values behind ``refs``: Ray object refs are read from the object store (``ray.get``); the in-process
    transport (``local.LocalPools``) hands a worker the values themselves."""
    refs = list(refs)
    if any(type(r).__name__ == "ObjectRef" for r in refs):
        import ray

        return ray.get(refs)
    return refs


class InjectedFailure(RuntimeError):
    """Raised by the ``inject_failure`` test hook (``control.run_plan.TestHooks``)."""


class WorkerBase:
    pool = "worker"
    gen_batch = SAMPLE_BATCH  # the most samples it draws at once (a trainer rank: ``trainer_generation_batch``)

    def __init__(self, name: str, config: dict, hooks: TestHooks | None = None, log_file: str | None = None):
        if log_file:  # a Ray actor: its stdout / stderr (model loading, warnings, tracebacks) into run_dir/logs/
            capture_output(log_file, name)
        import torch

        self.cfg = Config.model_validate(config)
        self.gen_batch = min(self.gen_batch, self.cfg.sampler.batch_size or self.gen_batch)
        threads = self.cfg.runtime.threads_per_worker
        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(threads)
        except RuntimeError:  # already set in this process
            pass
        self.name = name
        self.hooks = hooks or TestHooks()
        self._prompts: dict[int, list] = {}

    # ---- helpers -------------------------------------------------------------------------------------
    def ping(self) -> str:
        return self.name

    def clock(self) -> float:
        """This process's ``time.monotonic()``: the clock of its results' start / end stamps (``clocks``)."""
        return time.monotonic()

    def sees(self, path: str, token: str) -> tuple[str, bool]:
        """(this node's IP, whether ``path`` holds ``token`` here): does this worker see the driver's log folder
        (``cluster.check_shared``)."""
        import ray

        try:
            seen = Path(path).read_text() == token
        except OSError:
            seen = False
        return ray.util.get_node_ip_address(), seen

    def node_endpoint(self) -> tuple[str, int]:
        """(this node's IP, a free TCP port on it) for a torch.distributed rendezvous hosted here."""
        import ray

        ip = ray.util.get_node_ip_address()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            return ip, s.getsockname()[1]

    def prompts(self, step: int) -> list:
        p = self._prompts.get(step)
        if p is None:
            p = self._prompts[step] = self.task.train_prompts(step, self.cfg.train.prompts_per_step, self.cfg.seed)
            for old in [s for s in self._prompts if s < step - 2]:
                del self._prompts[old]
        return p

    def check_failure(self, step: int | str) -> None:
        """The ``inject_failure`` test hook (``control.run_plan.TestHooks``): fail here if it names this worker and
        ``step`` (the scheduler's step, which the hook names by its ``schedule.step_number``, or a phase of
        ``run_plan.HOOK_PHASES``)."""
        f, named = self.hooks, step_number(step) if isinstance(step, int) else step
        if f.fails and f.worker == self.name and f.step == named:
            self.hooks = f.without_failure()  # once per process
            if f.kind == "exit":
                os._exit(1)  # simulate a crashed process (the actor dies)
            if f.kind == "stall":
                os.kill(os.getpid(), signal.SIGSTOP)  # a hung process: alive, never answers
            at = f"step {named}" if isinstance(named, int) else named
            raise InjectedFailure(f"injected failure of {self.name} at {at} (DIGENRL_TEST_HOOKS inject_failure)")

    def calibration_start(self, gen_sizes: list[int], cell_sizes: list[int]) -> list[list[tuple]]:
        """Prepare the timing of generation (per fragment size) and, on a trainer, of training (per chunk size),
        commit and publish (``timing.Calibration``); the op keys in blocks."""
        self.check_failure("calibrate")
        trainer = self.pool == "trainer"
        self._calibration = Calibration(self, self.policy, gen_sizes, cell_sizes if trainer else [], trainer=trainer)
        return self._calibration.keys()

    def calibration_run(self, key: tuple) -> float:
        """Seconds of one execution of the op ``key`` (one call per execution)."""
        return self._calibration.run(key)

    def calibration_end(self) -> bool:
        self._calibration.end()
        self._calibration = None
        return True

    def generate_parts(self, policy, parts, version: int, lead: bool = True) -> tuple:
        """A gang's share on this rank (``layout.gang_shares``: one fragment per part of the gang, of different
        prompt groups, some maybe empty), sampled together (in batches of at most ``gen_batch``), then cut per
        part: (trajectories or None, ..., infos), one trajectory batch per part and a tuple of one ``FragmentInfo``
        per part (same start/end).
        ``lead=False``: a follower of a sequence-parallel group, which runs the same forwards (collectives) as
        its lead and reports nothing: no decode, no reward, Nones and infos without generations."""
        from digenrl.train.step_math import generate

        t0 = time.monotonic()
        step = parts[0].step
        prompts = self.prompts(step)
        pairs = [(i, g) for i, p in enumerate(parts) for g in p.generations]
        args = ([prompts[parts[i].group] for i, _ in pairs], [g for _, g in pairs])
        kw = dict(step=step, run_seed=self.cfg.seed, version=version, settings=self.sampler,
                  plan=timestep_plan(self.cfg, step), max_batch=self.gen_batch)
        if not lead:  # the lead's sampling (its collectives), without decode or reward
            if pairs:
                generate(policy, *args, **kw, decode=False)
            now = time.monotonic()  # infos without generations (merged away by the executor)
            return (*([None] * len(parts)), tuple(FragmentInfo(replace(p, generations=()), self.name, version, -1, (),
                                                               {}, t0, now) for p in parts))
        batch = None
        if pairs:
            batch = generate(policy, *args, **kw, reward=self.reward)
            batch.images = None
        t1 = time.monotonic()
        out, infos = [], []
        for i, p in enumerate(parts):
            idx = [j for j, (k, _) in enumerate(pairs) if k == i]
            part = (batch if len(idx) == len(pairs) else batch.select(idx)) if idx else None
            rewards = tuple(float(r) for r in part.rewards) if part is not None else ()
            rp = {k: tuple(float(x) for x in v) for k, v in (part.reward_parts or {}).items()} if part is not None else {}
            out.append(part)
            infos.append(FragmentInfo(p, self.name, version, prompts[p.group].uid if idx else -1, rewards, rp, t0, t1))
        return (*out, tuple(infos))
