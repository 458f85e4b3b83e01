"""Request batching of the reward service (``rewards.service``) and its scoring call (total and parts).

Batching: handler threads put requests in a queue; one scoring thread takes the oldest request, opens a batch
and keeps adding queued requests with the same image shape until the batch holds ``max_batch`` samples or
``max_wait`` seconds have passed since it opened; it scores the concatenated batch in one call and hands
each request its slice. A request larger than ``max_batch`` is scored alone. ``batch_sizes`` keeps the sizes of
the last batches (the service's ``/health`` reports them).

Isolation: if a batch of several requests fails, each request is scored again alone, so one bad request fails
only itself (the service turns that request's error into its HTTP answer).
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Sequence

import torch

from digenrl.rollout.records import Prompt


@dataclass
class _Job:
    images: torch.Tensor
    prompts: list[Prompt]
    future: Future = field(default_factory=Future)


def score_with_parts(fn, images: torch.Tensor, prompts: Sequence[Prompt]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(total, {part: scores}) of ``fn`` on a batch, float32 on the CPU, one score per image: a weighted sum's
    ``score`` gives its parts, a single reward is its own only part (named by its ``name``)."""
    if hasattr(fn, "score"):
        total, parts = fn.score(images, prompts)
    else:
        total = fn(images, prompts)
        parts = {getattr(fn, "name", "reward"): total}
    return total.float().cpu().reshape(-1), {k: v.float().cpu().reshape(-1) for k, v in parts.items()}


class RequestBatcher:
    """Groups concurrent scoring requests into batches (see the module docstring)."""

    def __init__(self, fn, max_batch: int = 32, max_wait: float = 0.01):
        if max_batch < 1 or max_wait < 0:
            raise ValueError(f"max_batch must be >= 1 and max_wait >= 0, got {max_batch}, {max_wait}")
        self.fn, self.max_batch, self.max_wait = fn, int(max_batch), float(max_wait)
        self.batch_sizes: collections.deque[int] = collections.deque(maxlen=1000)
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._carry: list[_Job] = []
        self._thread = threading.Thread(target=self._run, name="reward-batcher", daemon=True)
        self._thread.start()

    def submit(self, images: torch.Tensor, prompts: Sequence[Prompt]) -> Future:
        if images.shape[0] != len(prompts):
            raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
        job = _Job(images, list(prompts))
        self._queue.put(job)
        return job.future

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _next(self, timeout: float | None) -> _Job | None:
        if self._carry:
            return self._carry.pop(0)
        return self._queue.get(timeout=timeout) if timeout is None or timeout > 0 else self._queue.get_nowait()

    def _run(self) -> None:
        while True:
            first = self._next(None)
            if first is None:
                return
            batch, size = [first], first.images.shape[0]
            deadline = time.monotonic() + self.max_wait
            held: list[_Job] = []
            while size < self.max_batch:
                try:
                    job = self._next(deadline - time.monotonic())
                except queue.Empty:
                    break
                if job is None:
                    self._queue.put(None)
                    break
                n = job.images.shape[0]
                if job.images.shape[1:] != first.images.shape[1:] or size + n > self.max_batch:
                    held.append(job)
                    continue
                batch.append(job)
                size += n
            self._carry = held + self._carry
            self._score(batch, size)

    def _score(self, batch: list[_Job], size: int) -> None:
        self.batch_sizes.append(size)
        try:
            images = torch.cat([j.images for j in batch])
            total, parts = score_with_parts(self.fn, images, [p for j in batch for p in j.prompts])
            if total.shape[0] != size:
                raise RuntimeError(f"reward returned {total.shape[0]} scores for {size} samples")
        except Exception as e:
            if len(batch) == 1:
                batch[0].future.set_exception(e)
            else:  # isolate: score each request alone, so a bad one fails only itself
                for j in batch:
                    self._score([j], j.images.shape[0])
            return
        start = 0
        for j in batch:
            n = j.images.shape[0]
            j.future.set_result((total[start : start + n], {k: v[start : start + n] for k, v in parts.items()}))
            start += n
