"""One clock for a run: the driver's monotonic clock, and every worker's stamps mapped onto it.

A worker stamps its results with its own ``time.monotonic()`` (``messages``): the driver's clock on one node
(Linux ``CLOCK_MONOTONIC``), another origin on another node; the wall clock can be stepped mid-run (NTP, a VM
resuming: ~20 ms seen once here), so it is no common ground either. So the driver measures each worker's offset
once, when the pools start (Cristian's method): it reads its clock at ``t_send``, asks the worker for its clock
``t_w`` and reads its clock again at ``t_recv``. The worker read its clock inside [t_send, t_recv], so

    offset = driver clock - worker clock  lies in  [t_send - t_w, t_recv - t_w],

and the midpoint ``(t_send + t_recv) / 2 - t_w`` is off by at most half the round trip. Of several samples the
one with the shortest round trip is kept; that half round trip is the stamps' error bound (``clock_error_s`` of
the run summary)."""

from __future__ import annotations

import time
from dataclasses import dataclass

CLOCK_SAMPLES = 3  # round trips per worker: the shortest one's midpoint is the offset


@dataclass(frozen=True)
class ClockSample:
    """One round trip: the driver's clock when it asked (``send``) and when it had the answer (``recv``), and the
    worker's clock in the answer (``worker``)."""

    send: float
    worker: float
    recv: float

    @property
    def round_trip(self) -> float:
        return self.recv - self.send


def estimate_offset(samples: list[ClockSample]) -> tuple[float, float]:
    """(offset, error bound) of a worker's clock from round trips: driver time = worker stamp + offset, off by
    at most the error bound = half the shortest round trip (the offset of that round trip's midpoint)."""
    if not samples:
        raise ValueError("estimate_offset: no clock samples")
    best = min(samples, key=lambda s: s.round_trip)
    if best.round_trip < 0:
        raise ValueError(f"estimate_offset: a round trip ends before it starts ({best})")
    return (best.send + best.recv) / 2.0 - best.worker, best.round_trip / 2.0


def measure_offsets(ask: dict, samples: int = CLOCK_SAMPLES) -> tuple[dict[str, float], float]:
    """({worker: offset}, the largest error bound) of the workers in ``ask`` ({worker: call returning its
    clock}), one worker after the other so that no answer waits behind another's."""
    offsets, error = {}, 0.0
    for w, call in ask.items():
        got = []
        for _ in range(samples):
            send = time.monotonic()
            t_w = call()
            got.append(ClockSample(send, t_w, time.monotonic()))
        offsets[w], err = estimate_offset(got)
        error = max(error, err)
    return offsets, error


class Clock:
    """Run-relative seconds on the driver's monotonic clock: ``now()``; ``at(worker, stamp)`` places a worker's
    stamp on it through the offsets measured for the current pools (``use``)."""

    def __init__(self) -> None:
        self.offsets: dict[str, float] = {}
        self.reset()

    def reset(self) -> None:
        self.t0 = time.monotonic()

    def use(self, offsets: dict[str, float]) -> None:
        """The offsets of the workers of a (re)started set of pools."""
        self.offsets = dict(offsets)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def at(self, worker: str, stamp: float) -> float:
        try:
            return stamp + self.offsets[worker] - self.t0
        except KeyError:
            raise KeyError(f"no clock offset for worker {worker!r} (measured for {sorted(self.offsets)})") from None
