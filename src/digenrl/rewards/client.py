"""``RemoteReward``: a reward computed by the reward service (``digenrl reward-serve``), registered as "remote".

Each call is one ``POST /score``. ``score()`` returns the total and the service's per-reward breakdown
(``parts``), which a ``WeightedSum`` logs as ``reward/remote/<part>``.

Transient failures (connection refused or reset, timeouts, HTTP 5xx and 429) are retried with exponential
backoff, ``delay_k = min(backoff * 2**k, backoff_max)`` before attempt k + 2, for as long as the elapsed time
stays within ``retry_window`` seconds (default 600 s: long enough for a reward model to be restarted; the
generator waits meanwhile, so the run pauses and loses nothing) and, if set, for at most ``retries`` retries.
Past them a ``RewardServiceError`` names the key and the URL, the attempts, the time and the last error. HTTP 4xx (a
request the service refuses, e.g. a malformed payload or a wrong token) is deterministic and raised at once.
``post_retrying`` is this loop, shared with the other rewards that call a server (``geneval``, ``vlm_judge``).

``token`` (else the first line of ``token_file``, else the environment variable named by ``token_env``, default
``DIGENRL_REWARD_TOKEN``) is sent as ``Authorization: Bearer <token>``, for services bound beyond loopback with a
token. ``token_file`` or the environment keep the token out of the run's ``config.yaml`` (``token`` is saved there).
"""

from __future__ import annotations

import itertools
import json
import os
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Iterable, Iterator, Literal, Sequence

import torch

from digenrl.rewards import wire
from digenrl.rewards.base import Scored, check_url

TOKEN_ENV = "DIGENRL_REWARD_TOKEN"


class RewardServiceError(RuntimeError):
    """The reward service could not score a batch (down past the retry window, or refusing the request)."""


def post_retrying(url: str, body: bytes, token: str | None, timeout: float, delays: Iterable[float],
                  parse: Callable[[bytes], Any] = json.loads, retry_on: tuple[type[Exception], ...] = (), *,
                  setting: str, error: type[Exception] = RuntimeError, limit: str | None = None) -> Any:  # fmt: skip
    """``parse`` of the answer to ``POST body`` (JSON; with ``Authorization: Bearer <token>`` if a token is given),
    retrying what a retry can fix -- connection errors, timeouts, HTTP 429 and 5xx, and ``retry_on`` raised by
    ``parse`` -- after sleeping each of ``delays`` in turn. The two messages of every server a reward calls, as
    ``error``, each naming the config key of the address (``setting``, e.g. ``reward remote: url``) and the URL:
    any other HTTP 4xx is deterministic and raised at once, with the code and the server's answer; past the delays,
    the attempts, the time, what bounded the retries (``limit``, e.g. ``retry_window 600s``) and the last error."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    delays, attempts, start = iter(delays), 0, time.monotonic()
    while True:
        attempts += 1
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=timeout) as r:
                return parse(r.read())
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:500]
            if 400 <= e.code < 500 and e.code != 429:
                raise error(f"{setting}: {url} refused the request ({e.code}): {detail[:300]}") from None
            last = f"HTTP {e.code}: {detail}"
        except (urllib.error.URLError, OSError, TimeoutError, *retry_on) as e:
            last = repr(getattr(e, "reason", e))
        delay = next(delays, None)
        if delay is None:
            raise error(f"{setting}: {url} unavailable after {attempts} attempts over "
                              f"{time.monotonic() - start:.1f}s ({limit + '; ' if limit else ''}last error: {last})")
        time.sleep(delay)


class RemoteReward(Scored):
    def __init__(self, url: str, timeout: float = 120.0, retry_window: float = 600.0, backoff: float = 0.5,
                 backoff_max: float = 10.0, wire_dtype: Literal["float32", "uint8"] = "float32", name: str = "remote",
                 token: str | None = None, token_env: str = TOKEN_ENV, retries: int | None = None,
                 token_file: str | None = None):  # fmt: skip
        """Options of ``reward.remote`` (the module docstring); ``url`` is required, e.g. http://127.0.0.1:8900."""
        self.check(url, token_file)
        if (retries is not None and retries < 0) or retry_window < 0 or timeout <= 0 or backoff < 0 or backoff_max < 0:
            raise ValueError("reward remote: need retry_window >= 0, timeout > 0, backoff >= 0, backoff_max >= 0")
        self.url = url.rstrip("/")
        self.timeout, self.retry_window = float(timeout), float(retry_window)
        self.backoff, self.backoff_max = float(backoff), float(backoff_max)
        self.wire_dtype, self.name, self.retries = wire_dtype, name, retries
        if token is None and token_file is not None:
            token = read_token(token_file)
        self.token = token if token is not None else (os.environ.get(token_env) or None)

    @staticmethod
    def check(url: str, token_file: str | None = None, **_) -> None:
        check_url("reward remote: url", url)
        if token_file is not None:
            read_token(token_file)

    def _delays(self, start: float) -> Iterator[float]:
        """min(backoff 2^k, backoff_max) while the retries last and the elapsed time stays within the window."""
        for k in itertools.count():
            delay = min(self.backoff * 2**k, self.backoff_max)
            if (self.retries is not None and k >= self.retries) or time.monotonic() - start + delay > self.retry_window:
                return
            yield delay

    def _scores(self, raw: bytes, n: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        out = json.loads(raw)
        scores = torch.tensor(out["scores"], dtype=torch.float32)
        parts = {k: torch.tensor(v, dtype=torch.float32) for k, v in out.get("parts", {}).items()}
        if scores.shape != (n,):
            raise RewardServiceError(f"reward service at {self.url} returned {tuple(scores.shape)} scores for {n} "
                                     "samples")  # fmt: skip
        return scores, parts

    def score(self, images: torch.Tensor, prompts: Sequence) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        body = json.dumps(
            {"images": wire.encode_images(images, self.wire_dtype), "prompts": wire.encode_prompts(prompts)}
        ).encode()
        return post_retrying(self.url + "/score", body, self.token, self.timeout, self._delays(time.monotonic()),
                             lambda raw: self._scores(raw, len(prompts)), (ValueError, KeyError),
                             setting="reward remote: url", error=RewardServiceError,
                             limit=f"retry_window {self.retry_window:g}s")  # fmt: skip


build_remote_reward = RemoteReward  # the registry's factory of "remote" (runtime.deadlines reads its defaults)


def read_token(path: str, what: str = "reward remote: token_file") -> str:
    """The stripped text of a token file; ``ValueError`` naming ``what`` and the path if unreadable or empty."""
    try:
        token = open(path, encoding="utf-8").read().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{what} {path!r} cannot be read: {getattr(e, 'strerror', None) or e}") from None
    if not token:
        raise ValueError(f"{what} {path!r} is empty")
    return token
