"""``AsyncReward``: score on a thread pool so reward computation overlaps generation.

``submit(images, prompts)`` returns a ``concurrent.futures.Future`` of the ``[B]`` scores (or of
``(scores, parts)`` with ``submit_parts``); the caller keeps sampling the next fragment and collects the
future when the group needs its advantages. Scoring code that releases the GIL (torch ops, HTTP waits of
``RemoteReward``) runs concurrently with the sampler.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Sequence

import torch

from digenrl.rewards.batching import score_with_parts


class AsyncReward:
    def __init__(self, fn, max_workers: int = 2):
        self.fn = fn
        self.name = getattr(fn, "name", "reward")
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="reward")

    def submit(self, images: torch.Tensor, prompts: Sequence) -> Future:
        """Future of the scores; ``images`` are copied so the caller may reuse its buffers."""
        return self._pool.submit(self.fn, images.detach().clone(), list(prompts))

    def submit_parts(self, images: torch.Tensor, prompts: Sequence) -> Future:
        """Future of ``(scores, {part: scores})`` (parts of a ``WeightedSum``)."""
        return self._pool.submit(score_with_parts, self.fn, images.detach().clone(), list(prompts))

    def __call__(self, images: torch.Tensor, prompts: Sequence) -> torch.Tensor:
        return self.submit(images, prompts).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> "AsyncReward":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
