"""``RemoteReward``: a reward computed by the reward service (``digenrl reward-serve``), registered as "remote".

Each call is one ``POST /score``. Transport failures (connection refused, timeouts, HTTP 5xx) are retried with
exponential backoff, ``delay_k = min(backoff * 2**k, backoff_max)`` before attempt k + 2; after
``retries + 1`` attempts a ``RewardServiceError`` names the URL, the number of attempts and the last error.
HTTP 4xx (a malformed request) is not retried.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Sequence

import torch

from digenrl.rewards import wire


class RewardServiceError(RuntimeError):
    """The reward service could not score a batch (down, failing, or refusing the request)."""


class RemoteReward:
    def __init__(self, url: str, timeout: float = 120.0, retries: int = 4, backoff: float = 0.5,
                 backoff_max: float = 10.0, wire_dtype: str = "float32", name: str = "remote"):  # fmt: skip
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"reward remote: url must start with http:// or https://, got {url!r}")
        if retries < 0 or timeout <= 0 or backoff < 0:
            raise ValueError("reward remote: need retries >= 0, timeout > 0, backoff >= 0")
        self.url = url.rstrip("/")
        self.timeout, self.retries, self.backoff, self.backoff_max = float(timeout), int(retries), backoff, backoff_max
        self.wire_dtype, self.name = wire_dtype, name

    def _post(self, body: bytes) -> dict:
        req = urllib.request.Request(self.url + "/score", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            return json.loads(resp.read())

    def score(self, images: torch.Tensor, prompts: Sequence) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        body = json.dumps(
            {"images": wire.encode_images(images, self.wire_dtype), "prompts": wire.encode_prompts(prompts)}
        ).encode()
        attempts, last, start = self.retries + 1, None, time.monotonic()
        for k in range(attempts):
            if k:
                time.sleep(min(self.backoff * 2 ** (k - 1), self.backoff_max))
            try:
                out = self._post(body)
                parts = {n: torch.tensor(v, dtype=torch.float32) for n, v in out.get("parts", {}).items()}
                return torch.tensor(out["scores"], dtype=torch.float32), parts
            except urllib.error.HTTPError as e:
                detail = e.read().decode(errors="replace")[:500]
                if 400 <= e.code < 500:
                    raise RewardServiceError(f"reward service at {self.url} refused the request ({e.code}): {detail}")
                last = f"HTTP {e.code}: {detail}"
            except (urllib.error.URLError, OSError, TimeoutError, ValueError) as e:
                last = repr(getattr(e, "reason", e))
        raise RewardServiceError(
            f"reward service at {self.url} unavailable after {attempts} attempts over "
            f"{time.monotonic() - start:.1f}s (last error: {last})"
        )

    def __call__(self, images: torch.Tensor, prompts: Sequence) -> torch.Tensor:
        return self.score(images, prompts)[0]


def build_remote_reward(url: str | None = None, **options) -> RemoteReward:
    if not url:
        raise ValueError("reward remote: option url is required (e.g. http://127.0.0.1:8900)")
    return RemoteReward(url, **options)
