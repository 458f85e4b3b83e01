"""GenEval-style object reward (registered as ``geneval``): the user's detector + GenEval's rules.

Each prompt carries GenEval metadata in ``Prompt.meta`` (a JSONL prompt file with ``tag`` / ``include`` /
``exclude`` keys; see ``rewards.geneval_rules``). A detector turns the batch into detections (class,
confidence, box, colour label); the rules of ``geneval_rules`` give per image ``score`` (Flow-GRPO's partial
credit, the default reward), ``strict`` (exact counts) and ``correct`` (the GenEval benchmark verdict).
``reward`` selects which one is the reward; all three are reported as parts.

Detectors (GenEval itself uses Mask2Former from mmdetection plus CLIP ViT-L/14 for colours; they do not
install from PyPI on CPU, so the model stays the user's):

* ``detector_url``: a detection service. ``POST`` JSON ``{"images": [<base64 PNG>, ...]}``, answer
  ``{"detections": [[{"class": str, "score": float, "box": [x1, y1, x2, y2], "color": str | null}, ...], ...]}``
  (one list per image, boxes in pixels). Retries transient failures like the reward client.
* ``detector_path``: a local transformers object-detection model (DETR, RT-DETR, YOLOS... on COCO classes),
  with ``color_model_path`` a local CLIP for GenEval's zero-shot colour labels (``rewards.geneval_detectors``).
* ``detector_factory``: ``"module:function"`` called once with ``detector_options`` (e.g. a local model path:
  ``{"model_path": "/models/mask2former"}``); it returns a callable mapping a list of HxWx3 uint8 RGB arrays to
  lists of ``Detection`` (or of the dicts above).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Literal, Sequence

import numpy as np
import torch

from digenrl.rewards.base import Scored, check_url, model_dir, png_base64, rgb_frames
from digenrl.rewards.client import post_retrying
from digenrl.rewards.geneval_rules import Detection, check_metadata, evaluate, filter_detections


def _as_detection(d: Any, where: str) -> Detection:
    if isinstance(d, Detection):
        return d
    try:
        box = tuple(float(v) for v in d["box"])
        if len(box) != 4:
            raise ValueError("box needs 4 numbers")
        return Detection(str(d["class"]), float(d["score"]), box, d.get("color"))  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"geneval: {where}: malformed detection {str(d)[:100]} ({e})") from None


class RemoteDetector:
    """The detection service protocol of the module docstring."""

    def __init__(self, url: str, timeout: float = 120.0, retries: int = 5, backoff: float = 1.0):
        self.url, self.timeout, self.retries, self.backoff = url, timeout, retries, backoff

    def __call__(self, images: list[np.ndarray]) -> list[list[dict]]:
        body = json.dumps({"images": [png_base64(img) for img in images]}).encode()
        where = f"geneval: detector {self.url}"
        out = post_retrying(self.url, body, None, self.timeout, [self.backoff * 2**k for k in range(self.retries)],
                            lambda raw: json.loads(raw)["detections"], setting="reward geneval: detector_url")
        if not isinstance(out, list) or len(out) != len(images):
            raise ValueError(f"{where} returned {len(out)} lists for {len(images)} images")
        return out


class GenEvalReward(Scored):
    name = "geneval"

    @staticmethod
    def check(detector_url: str | None = None, detector_factory: str | None = None,
              detector_path: str | None = None, color_model_path: str | None = None, **_) -> None:  # fmt: skip
        if sum(x is not None for x in (detector_url, detector_factory, detector_path)) != 1:
            raise ValueError("reward geneval: set exactly one of detector_url (a detection service), detector_path "
                             "(a local transformers detection model) or detector_factory ('module:function')")  # fmt: skip
        if detector_url is not None:
            check_url("reward geneval: detector_url", detector_url)
        for option, path in (("detector_path", detector_path), ("color_model_path", color_model_path)):
            if path is not None:
                model_dir(f"reward geneval: {option}", path)
        if detector_factory is not None:
            from digenrl.rewards.registry import load_target

            load_target(detector_factory, "reward.geneval.detector_factory")

    def __init__(self, detector_url: str | None = None, detector_factory: str | None = None,
                 detector_options: dict[str, Any] | None = None, detector_path: str | None = None,
                 color_model_path: str | None = None, device: str = "cpu",
                 reward: Literal["score", "strict", "correct"] = "score", threshold: float = 0.3,
                 counting_threshold: float = 0.9, max_objects: int = 16, max_overlap: float = 1.0,
                 position_threshold: float = 0.1, timeout: float = 120.0):  # fmt: skip
        if sum(x is not None for x in (detector_url, detector_factory, detector_path)) != 1:
            self.check(detector_url, detector_factory, detector_path)  # names the options
        if detector_url is not None:
            self.detector: Callable = RemoteDetector(detector_url, timeout)
        elif detector_path is not None:
            from digenrl.rewards.geneval_detectors import TransformersDetector

            self.detector = TransformersDetector(detector_path, color_model_path, device)
        else:
            from digenrl.rewards.registry import load_target

            self.detector = load_target(detector_factory, "reward.geneval.detector_factory")(**(detector_options or {}))
        self.reward = reward
        self.filter_kw = dict(threshold=threshold, counting_threshold=counting_threshold, max_objects=max_objects,
                              max_overlap=max_overlap)  # fmt: skip
        self.position_threshold = position_threshold

    def score(self, images: torch.Tensor, prompts: Sequence) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        for p in prompts:
            try:
                check_metadata(p.meta)
            except ValueError as e:
                raise ValueError(f"{e} (prompt {p.text[:60]!r})") from None
        if images.ndim != 4:
            raise ValueError(f"reward geneval: expected images [B, C, H, W], got {tuple(images.shape)}")
        raw = self.detector(list(rgb_frames(images, "reward geneval", len(prompts))[:, 0]))
        results = [evaluate(filter_detections([_as_detection(d, f"image {i}") for d in dets],
                                              str(p.meta.get("tag", "")), **self.filter_kw), p.meta,
                            self.position_threshold) for i, (dets, p) in enumerate(zip(raw, prompts))]  # fmt: skip
        parts = {k: torch.tensor([float(getattr(r, k)) for r in results], dtype=torch.float32)
                 for k in ("score", "strict", "correct")}  # fmt: skip
        return parts[self.reward], parts
