"""``RemoteReward``: a reward computed by the reward service (``digenrl reward-serve``), registered as "remote".

Each call is one ``POST /score``. ``score()`` returns the total and the service's per-reward breakdown
(``parts``), which a ``WeightedSum`` logs as ``reward/remote/<part>``.

Transient failures (connection refused or reset, timeouts, HTTP 5xx and 429) are retried with exponential
backoff, ``delay_k = min(backoff * 2**k, backoff_max)`` before attempt k + 2, for as long as the elapsed time
stays within ``retry_window`` seconds (default 600 s: long enough for a reward model to be restarted; the
generator waits meanwhile, so the run pauses and loses nothing). Past the window a ``RewardServiceError``
names the URL, the attempts, the time and the last error. ``retries`` (optional) also caps the number of
retries. HTTP 4xx (a request the service refuses, e.g. a
malformed payload or a wrong token) is deterministic and raised at once, never retried.

``token`` (else the first line of ``token_file``, else the environment variable named by ``token_env``, default
``DIGENRL_REWARD_TOKEN``) is sent as ``Authorization: Bearer <token>``, for services bound beyond loopback with a
token. ``token_file`` or the environment keep the token out of the run's ``config.yaml`` (``token`` is saved there).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Literal, Sequence

import torch

from digenrl.rewards import wire

TOKEN_ENV = "DIGENRL_REWARD_TOKEN"


class RewardServiceError(RuntimeError):
    """The reward service could not score a batch (down past the retry window, or refusing the request)."""


class RemoteReward:
    def __init__(self, url: str, timeout: float = 120.0, retry_window: float = 600.0, backoff: float = 0.5,
                 backoff_max: float = 10.0, wire_dtype: str = "float32", name: str = "remote",
                 token: str | None = None, token_env: str = TOKEN_ENV, retries: int | None = None,
                 token_file: str | None = None):  # fmt: skip
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"reward remote: url must start with http:// or https://, got {url!r}")
        if (retries is not None and retries < 0) or retry_window < 0 or timeout <= 0 or backoff < 0 or backoff_max < 0:
            raise ValueError("reward remote: need retry_window >= 0, timeout > 0, backoff >= 0, backoff_max >= 0")
        self.url = url.rstrip("/")
        self.timeout, self.retry_window = float(timeout), float(retry_window)
        self.backoff, self.backoff_max = float(backoff), float(backoff_max)
        self.wire_dtype, self.name, self.retries = wire_dtype, name, retries
        if token is None and token_file is not None:
            token = read_token(token_file)
        self.token = token if token is not None else (os.environ.get(token_env) or None)

    def _post(self, body: bytes) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.url + "/score", data=body, headers=headers)
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            return json.loads(resp.read())

    def score(self, images: torch.Tensor, prompts: Sequence) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        body = json.dumps(
            {"images": wire.encode_images(images, self.wire_dtype), "prompts": wire.encode_prompts(prompts)}
        ).encode()
        start, k, last = time.monotonic(), 0, None
        while True:
            try:
                out = self._post(body)
                scores = torch.tensor(out["scores"], dtype=torch.float32)
                parts = {n: torch.tensor(v, dtype=torch.float32) for n, v in out.get("parts", {}).items()}
                if scores.shape != (len(prompts),):
                    raise RewardServiceError(f"reward service at {self.url} returned {tuple(scores.shape)} scores "
                                             f"for {len(prompts)} samples")  # fmt: skip
                return scores, parts
            except urllib.error.HTTPError as e:
                detail = e.read().decode(errors="replace")[:500]
                if 400 <= e.code < 500 and e.code != 429:
                    raise RewardServiceError(f"reward service at {self.url} refused the request ({e.code}): {detail}")
                last = f"HTTP {e.code}: {detail}"
            except (urllib.error.URLError, OSError, TimeoutError, ValueError, KeyError) as e:
                last = repr(getattr(e, "reason", e))
            k += 1
            delay = min(self.backoff * 2 ** (k - 1), self.backoff_max)
            out_of_retries = self.retries is not None and k > self.retries
            if out_of_retries or time.monotonic() - start + delay > self.retry_window:
                break
            time.sleep(delay)
        raise RewardServiceError(
            f"reward service at {self.url} unavailable after {k} attempts over "
            f"{time.monotonic() - start:.1f}s (retry_window {self.retry_window:g}s; last error: {last})"
        )

    def __call__(self, images: torch.Tensor, prompts: Sequence) -> torch.Tensor:
        return self.score(images, prompts)[0]


def build_remote_reward(url: str, timeout: float = 120.0, retry_window: float = 600.0, backoff: float = 0.5,
                        backoff_max: float = 10.0, wire_dtype: Literal["float32", "uint8"] = "float32",
                        name: str = "remote", token: str | None = None, token_env: str = TOKEN_ENV,
                        retries: int | None = None, token_file: str | None = None) -> RemoteReward:  # fmt: skip
    """Options of ``reward.remote`` (see ``RemoteReward``); ``url`` is required, e.g. http://127.0.0.1:8900."""
    return RemoteReward(url, timeout, retry_window, backoff, backoff_max, wire_dtype, name, token, token_env, retries,
                        token_file)  # fmt: skip


def read_token(path: str, what: str = "reward remote: token_file") -> str:
    """The stripped text of a token file; ``ValueError`` naming ``what`` and the path if unreadable or empty."""
    try:
        token = open(path, encoding="utf-8").read().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{what} {path!r} cannot be read: {getattr(e, 'strerror', None) or e}") from None
    if not token:
        raise ValueError(f"{what} {path!r} is empty")
    return token


def _check_remote(url: str, token_file: str | None = None, **_) -> None:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"reward remote: url must start with http:// or https://, got {url[:80]!r}")
    if token_file is not None:
        read_token(token_file)


build_remote_reward.check = _check_remote  # type: ignore[attr-defined]
