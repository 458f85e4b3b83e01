"""VLM-as-judge reward (registered as ``vlm_judge``): ask an OpenAI-compatible chat endpoint to grade each image.

Any server speaking ``POST {base_url}/chat/completions`` with image inputs works: vLLM or SGLang serving
UnifiedReward, Qwen2.5-VL, InternVL... One request per sample::

    {"model": model, "temperature": temperature, "max_tokens": max_tokens,
     "messages": [{"role": "user", "content": [
         {"type": "image_url", "image_url": {"url": "data:image/png;base64,<PNG>"}},
         {"type": "text", "text": prompt_template with {prompt} replaced by the sample's prompt}]}]}

The score is the first match of ``score_pattern`` (a regex whose group 1 is a number) in the reply's
``choices[0].message.content``; r = score / ``score_scale``. The defaults follow Flow-GRPO's UnifiedReward
reward (``unifiedreward_score_sglang``: a 1-5 grade after "Final Score:", divided by 5, images resized to
512x512, temperature 0; a reply without a score counts 0). ``on_parse_failure`` sets that value, or "error".

Requests run on ``concurrency`` threads; each has a ``timeout``; connection errors, timeouts, HTTP 429 and
5xx are retried ``retries`` times with backoff ``backoff * 2**k`` seconds; HTTP 4xx otherwise raises at once.
Videos ``[B, C, F, H, W]`` send their middle frame. ``info``: ``parsed`` (1 if a score was found), ``raw``
(the unnormalised score).
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, Sequence

import numpy as np
import torch

from digenrl.rewards.base import Scored, check_url, png_base64, rgb_frames
from digenrl.rewards.client import post_retrying

DEFAULT_TEMPLATE = (
    "Here is an image generated for the caption below. Judge (1) how faithfully the image depicts the caption "
    "-- its objects, attributes, counts and relations -- and (2) its visual quality -- sharpness, detail, "
    "colour and overall appeal. Reply with a short justification, then end with 'Final Score:' followed by a "
    "number from 1 to 5.\nCaption: [{prompt}]"
)
DEFAULT_PATTERN = r"Final Score:\s*\**\s*([0-9]+(?:\.[0-9]+)?)"


class VlmJudgeError(RuntimeError):
    """The judge endpoint refused a request or stayed unavailable through the retries."""


class VlmJudge(Scored):
    name = "vlm_judge"

    @staticmethod
    def check(base_url: str, model: str, prompt_template: str = DEFAULT_TEMPLATE, score_pattern: str = DEFAULT_PATTERN,
              **_) -> None:  # fmt: skip
        check_url("reward vlm_judge: base_url", base_url)
        if "{prompt}" not in prompt_template:
            raise ValueError("reward vlm_judge: prompt_template must contain the placeholder {prompt}")
        try:
            groups = re.compile(score_pattern).groups
        except re.error as e:
            raise ValueError(f"reward vlm_judge: score_pattern is not a valid regex: {e}") from None
        if groups < 1:
            raise ValueError("reward vlm_judge: score_pattern needs a group capturing the number")

    def __init__(self, base_url: str, model: str, prompt_template: str = DEFAULT_TEMPLATE,
                 score_pattern: str = DEFAULT_PATTERN, score_scale: float = 5.0,
                 on_parse_failure: float | Literal["error"] = 0.0, concurrency: int = 8, timeout: float = 120.0,
                 retries: int = 3, backoff: float = 1.0, temperature: float = 0.0, max_tokens: int | None = None,
                 image_size: int | None = 512, api_key: str | None = None, api_key_env: str = "OPENAI_API_KEY"):  # fmt: skip
        self.check(base_url, model, prompt_template, score_pattern)
        self.pattern = re.compile(score_pattern)
        if concurrency < 1 or timeout <= 0 or retries < 0 or backoff < 0 or score_scale == 0:
            raise ValueError("reward vlm_judge: need concurrency >= 1, timeout > 0, retries >= 0, backoff >= 0, "
                             "score_scale != 0")  # fmt: skip
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.template, self.scale = model, prompt_template, float(score_scale)
        self.on_parse_failure = on_parse_failure
        self.concurrency, self.timeout, self.retries, self.backoff = int(concurrency), float(timeout), int(retries), backoff
        self.temperature, self.max_tokens, self.image_size = float(temperature), max_tokens, image_size
        self.api_key = api_key if api_key is not None else os.environ.get(api_key_env)

    # -- one sample ---------------------------------------------------------------------------------------
    def _request(self, rgb: np.ndarray, prompt: str) -> bytes:
        url = "data:image/png;base64," + png_base64(rgb, self.image_size)
        body: dict = {
            "model": self.model,
            "temperature": self.temperature,
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": self.template.replace("{prompt}", prompt)},
            ]}],
        }  # fmt: skip
        if self.max_tokens is not None:
            body["max_tokens"] = int(self.max_tokens)
        return json.dumps(body).encode()

    def _content(self, raw: bytes) -> str:
        try:
            return str(json.loads(raw)["choices"][0]["message"]["content"] or "")
        except (KeyError, IndexError, TypeError, json.JSONDecodeError) as e:
            raise VlmJudgeError(f"vlm_judge: {self.url} answered without choices[0].message.content ({e!r})") from None

    def ask(self, rgb: np.ndarray, prompt: str) -> str:
        """The judge's reply text for one HxWx3 uint8 image (with retries, see the module docstring)."""
        return post_retrying(self.url, self._request(rgb, prompt), self.api_key, self.timeout,
                             [self.backoff * 2**k for k in range(self.retries)], self._content,
                             setting="reward vlm_judge: base_url", error=VlmJudgeError,
                             limit=f"retries {self.retries}")

    def parse(self, reply: str) -> float | None:
        m = self.pattern.search(reply)
        if m is None:
            return None
        try:
            return float(m.group(1))
        except ValueError:
            return None

    # -- batch --------------------------------------------------------------------------------------------
    def score(self, images: torch.Tensor, prompts: Sequence) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        arr = rgb_frames(images, "reward vlm_judge", len(prompts))
        arr = arr[:, arr.shape[1] // 2]  # a video's middle frame
        texts = [p.text if hasattr(p, "text") else str(p) for p in prompts]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(texts)) or 1) as pool:
            replies = list(pool.map(self.ask, list(arr), texts))
        raw, parsed = [], []
        for reply, text in zip(replies, texts):
            value = self.parse(reply)
            if value is None and self.on_parse_failure == "error":
                raise ValueError(f"reward vlm_judge: no score in the reply for {text[:60]!r}: {reply[:200]!r}")
            parsed.append(value is not None)
            raw.append(value if value is not None else float(self.on_parse_failure) * self.scale)
        raw_t = torch.tensor(raw, dtype=torch.float32)
        return raw_t / self.scale, {"parsed": torch.tensor(parsed, dtype=torch.float32), "raw": raw_t}
