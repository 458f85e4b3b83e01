"""Stopping a run on SIGINT / SIGTERM without losing it.

The first signal asks the run to stop: a loop that polls ``StopRequest.requested`` finishes (or abandons) its
current step, writes a resumable checkpoint and raises ``Interrupted``; with ``abandon=True`` (a controller
blocked in Ray calls) the handler raises ``Interrupted`` at once, the open transaction is dropped and the run
resumes from its last checkpoint. The CLI then writes ``failure.json``, prints one line saying how to resume
and exits with ``EXIT_INTERRUPTED`` (75, EX_TEMPFAIL: "try again later"). A second signal exits at once with
128 + signal number (no cleanup; the last complete checkpoint stays valid: writes are atomic).
"""

from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

EXIT_INTERRUPTED = 75
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    """The run stopped on a signal; ``step`` committed steps are in ``checkpoint`` (None: the newest one)."""

    def __init__(self, signal_name: str, step: int | None = None, checkpoint: Path | None = None):
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        super().__init__(f"interrupted by {signal_name}" + (f" after step {step}" if step is not None else ""))


class StopRequest:
    def __init__(self, *, abandon: bool = False):
        self.abandon = abandon
        self.signal_name: str | None = None

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def check(self, step: int, checkpoint: Path | None = None) -> None:
        """Raise ``Interrupted`` if a stop was requested (call at a step boundary, after checkpointing)."""
        if self.signal_name is not None:
            raise Interrupted(self.signal_name, step, checkpoint)

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.signal_name is not None:
            print(f"\ndigenrl: second {name}: exiting now", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        self.signal_name = name
        what = "abandoning the current step" if self.abandon else "finishing the current step, then checkpoint"
        print(f"\ndigenrl: {name}: {what} and stop ({name} again to exit at once)",
              file=sys.stderr, flush=True)
        if self.abandon:
            raise Interrupted(name)

    @contextmanager
    def installed(self):
        """Install the handlers in the main thread for the duration of the block."""
        old = {s: signal.getsignal(s) for s in SIGNALS}
        for s in SIGNALS:
            signal.signal(s, self._handle)
        try:
            yield self
        finally:
            for s, h in old.items():
                signal.signal(s, h)


def write_failure(run_dir: Path, e: Interrupted, checkpoint: Path | None, resume_cmd: str | None) -> None:
    """``failure.json`` of a stopped run (deleted when a later run of the directory finishes)."""
    import json

    from digenrl.safe_files import atomic_write_bytes

    rec = {"error": str(e), "signal": e.signal_name, "step": e.step,
           "checkpoint": str(checkpoint) if checkpoint else None, "resume": resume_cmd}
    if run_dir.is_dir():
        atomic_write_bytes(run_dir / "failure.json", json.dumps(rec, indent=2).encode())
