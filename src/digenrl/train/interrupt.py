"""Stopping a run on SIGINT / SIGTERM without losing it.

The first signal asks the run to stop: the controller (``runtime.driver``) polls ``StopRequest.requested`` at
each step boundary (an in-process run: its thread is the workers', so the step in progress is finished), writes
a resumable checkpoint and raises ``Interrupted``; with ``abandon=True`` (a controller blocked in Ray calls) the
handler raises ``Interrupted`` at once, the open transaction is dropped and the run resumes from its last
checkpoint. The CLI then writes ``failure.json`` and exits with ``EXIT_INTERRUPTED`` (75, EX_TEMPFAIL: "try
again later"); a second signal exits at once with 128 + signal number after ``kill_descendants``, no cleanup
(docs/reliability.md, "Signals").
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


def as_interrupted(e: BaseException | None) -> Interrupted | None:
    """The ``Interrupted`` behind ``e``: ``e`` itself, or the first one on its chain of causes and contexts; else
    None. The handler raises ``Interrupted`` wherever the main thread happens to be, so it can come back as
    another error:
    - ``SystemError`` from it: it was raised inside a C extension's call that checks for signals (Ray's
      ``wait`` / ``get`` then return a result with the exception set);
    - an error whose cause is it: code that wraps what a call raised (``ray.get`` -> ``WorkerFailure``);
    - an error raised while it propagated: a ``finally`` of third-party code that it broke half-way (tqdm's
      ``write`` releases a lock that the interrupted ``get_lock`` never made: ``AttributeError``).
    The stop signal is the root event in each case."""
    for _ in range(8):
        if e is None or isinstance(e, Interrupted):
            return e
        e = e.__cause__ or e.__context__
    return None


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
            kill_descendants()
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


def kill_descendants() -> None:
    """SIGKILL every process this one started, and theirs (a local Ray: GCS, raylet, the actors), twice over
    (a process started meanwhile). A joined Ray cluster's processes are not descendants: its GCS ends the
    actors of a driver that is gone."""
    import psutil

    for _ in range(2):
        for pid in [p.pid for p in psutil.Process().children(recursive=True)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
