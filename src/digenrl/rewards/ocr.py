"""OCR reward (registered as ``ocr``): how well the image renders the text quoted in its prompt.

Scored as Flow-GRPO's text-rendering reward (``flow_grpo/ocr.py``), with RapidOCR (PP-OCRv4 detection and
recognition on ONNX Runtime; the ``rapidocr-onnxruntime`` wheel ships the model files, so it runs offline on
CPU) in place of PaddleOCR. For each image:

* target t = the text between the first pair of double quotes of the prompt (``'a sign saying "Hello"'``
  -> ``Hello``), spaces removed, lower-cased;
* recognised text s = the recognised lines (confidence >= ``text_score``, 0.5 as PaddleOCR's drop score)
  concatenated in reading order, spaces removed, lower-cased;
* d = 0 if t is a substring of s, else the Levenshtein distance lev(s, t), capped at len(t) ("many unrelated
  characters cost at most the whole target");
* r = 1 - d / len(t)  in [0, 1]. An OCR failure scores 0 (d = len(t)).

A prompt without quoted text is refused (``ValueError``) unless ``target = "prompt"``, which scores against
the whole prompt. Videos ``[B, C, F, H, W]`` are scored on frames ``0, frame_stride, 2*frame_stride...``
(default every 4th) and reduced as Flow-GRPO's video OCR reward (``video_ocr``, ``OcrScorer_video_or_image``, as
ModelTC/GenRL's port of it describes: every 4th frame, the mean of the frames that score > 0, 0 when none
does): ``frame_reduce: positive_mean``; ``mean`` averages every scored frame. An image is one frame (both
reductions give r).

Detection resizes each image so that its ``det_limit_type`` ("min" or "max") side is ``det_limit_side_len``
(RapidOCR's defaults: min side 736; PaddleOCR's: max side 960). A 512x512 sample costs ~1 s of CPU with the
defaults; "max" / 512 is several times cheaper for images whose text is not tiny.
"""

from __future__ import annotations

from typing import Literal, Sequence

import numpy as np
import torch

from digenrl.rewards.base import Scored, rgb_frames


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (unit-cost insertions, deletions, substitutions), O(len(a) * len(b))."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def quoted_text(prompt: str) -> str | None:
    """The text between the first two double quotes, or None."""
    parts = prompt.split('"')
    return parts[1] if len(parts) >= 3 else None


def _normalise(text: str) -> str:
    return text.replace(" ", "").lower()


def ocr_similarity(recognised: str, target: str) -> float:
    """r = 1 - min(d, len(t)) / len(t), d = 0 if t in s else lev(s, t) (both normalised)."""
    s, t = _normalise(recognised), _normalise(target)
    if not t:
        raise ValueError("reward ocr: the target text is empty")
    d = 0 if t in s else min(edit_distance(s, t), len(t))
    return 1.0 - d / len(t)


def reduce_frames(vals: list[float], how: str) -> float:
    """One video's score from its frames' scores: ``positive_mean`` = mean of the scores > 0 (0 if none), as
    Flow-GRPO's video OCR reward; ``mean`` = mean of all."""
    if how == "positive_mean":
        pos = [v for v in vals if v > 0]
        return sum(pos) / len(pos) if pos else 0.0
    return sum(vals) / len(vals)


class OcrReward(Scored):
    """See the module docstring. ``threads``: ONNX Runtime intra-op threads (0: its default)."""

    name = "ocr"

    @staticmethod
    def check(**_) -> None:
        import importlib.util

        if importlib.util.find_spec("rapidocr_onnxruntime") is None:
            raise ValueError("reward ocr: the recogniser is not installed; pip install rapidocr-onnxruntime")

    def __init__(self, target: Literal["quoted", "prompt"] = "quoted", text_score: float = 0.5,
                 frame_stride: int = 4, threads: int = 1, use_cls: bool = False, det_limit_side_len: int = 736,
                 det_limit_type: Literal["min", "max"] = "min",
                 frame_reduce: Literal["positive_mean", "mean"] = "positive_mean"):  # fmt: skip
        if frame_stride < 1 or not 0.0 <= text_score <= 1.0:
            raise ValueError("reward ocr: need frame_stride >= 1 and text_score in [0, 1]")
        self.check()
        from rapidocr_onnxruntime import RapidOCR

        kwargs = {"text_score": text_score, "det_limit_side_len": det_limit_side_len, "det_limit_type": det_limit_type}
        if threads > 0:
            kwargs |= {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
        self.engine = RapidOCR(**kwargs)
        self.target, self.frame_stride, self.use_cls = target, int(frame_stride), bool(use_cls)
        self.frame_reduce = frame_reduce

    def recognise(self, rgb: np.ndarray) -> str:
        """Concatenated text of an HxWx3 uint8 RGB image (RapidOCR takes BGR arrays)."""
        result, _ = self.engine(np.ascontiguousarray(rgb[..., ::-1]), use_cls=self.use_cls)
        return "".join(line[1] for line in result) if result else ""

    def _target(self, prompt) -> str:
        if self.target == "prompt":
            return prompt.text
        text = quoted_text(prompt.text)
        if text is None:
            raise ValueError(f"reward ocr: prompt {prompt.text[:80]!r} has no quoted text to render "
                             "(set reward.ocr.target: prompt to score the whole prompt)")  # fmt: skip
        return text

    def score(self, images: torch.Tensor, prompts: Sequence) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        arr = rgb_frames(images, "reward ocr", len(prompts))  # [B, F, H, W, 3]
        targets = [self._target(p) for p in prompts]
        out, exact = [], []
        for frames, target in zip(arr, targets):
            vals = []
            for frame in frames[:: self.frame_stride]:
                try:
                    vals.append(ocr_similarity(self.recognise(frame), target))
                except ValueError:
                    raise
                except Exception:  # a recogniser failure scores 0, as in Flow-GRPO
                    vals.append(0.0)
            out.append(reduce_frames(vals, self.frame_reduce))
            exact.append(float(all(v == 1.0 for v in vals)))
        return torch.tensor(out, dtype=torch.float32), {"exact": torch.tensor(exact)}
