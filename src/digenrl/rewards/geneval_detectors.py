"""A local GenEval detector: any transformers object-detection model plus a CLIP colour classifier, both loaded
offline from local directories (``reward.geneval.detector_path`` / ``color_model_path``).

Detection: ``AutoModelForObjectDetection`` (DETR, Deformable/Conditional DETR, RT-DETR, YOLOS... trained on
COCO, whose class names GenEval's metadata uses) and its image processor; boxes, scores and labels come from
the processor's ``post_process_object_detection`` at ``min_score`` (the GenEval thresholds are applied later,
by the rules), class names from the model config's ``id2label``.

Colour (GenEval's zero-shot classifier, after ``clip_benchmark.zero_shot_classifier``): for an object of class
c, each colour k has the text embedding t_k = normalise(mean_j normalise(E_text(template_j(k, c)))) over the
templates "a photo of a {k} {c}", "a photo of a {k}-colored {c}", "a photo of a {k} object"; the object's
crop (its box cut from the image) gets the colour argmax_k <normalise(E_img(crop)), t_k>. GenEval pastes
the segmentation mask on a grey background before cropping; box detectors have no mask, so the plain crop is
used (GenEval's own behaviour when a detection has no mask).
"""

from __future__ import annotations

import numpy as np
import torch

from digenrl.rewards.base import model_dir
from digenrl.rewards.geneval_rules import COLORS, Detection
from digenrl.rewards.local_weights import resolve_device

TEMPLATES = ("a photo of a {c} {cls}", "a photo of a {c}-colored {cls}", "a photo of a {c} object")


class ColourClassifier:
    def __init__(self, model_path: str, device: str | None = None):
        from digenrl.rewards.clip_based import ClipEmbedder

        self.clip = ClipEmbedder(model_path, "geneval colour classifier", device)
        self._weights: dict[str, torch.Tensor] = {}

    def weights(self, cls: str) -> torch.Tensor:
        """[len(COLORS), D] unit text embeddings of the colours for class ``cls``."""
        if cls not in self._weights:
            rows = []
            for c in COLORS:
                emb = self.clip.texts([t.format(c=c, cls=cls) for t in TEMPLATES]).mean(dim=0)
                rows.append(emb / emb.norm())
            self._weights[cls] = torch.stack(rows)
        return self._weights[cls]

    def __call__(self, crops: list[np.ndarray], cls: str) -> list[str]:
        if not crops:
            return []
        img = self.clip.arrays(crops)
        return [COLORS[i] for i in (img @ self.weights(cls).T).argmax(dim=1).tolist()]


class TransformersDetector:
    """``images`` (HxWx3 uint8 RGB arrays) -> per image a list of ``Detection`` (with colours if a CLIP path
    is given)."""

    def __init__(self, detector_path: str, color_model_path: str | None = None, device: str | None = None,
                 min_score: float = 0.05):  # fmt: skip
        from transformers import AutoImageProcessor, AutoModelForObjectDetection

        p = model_dir("reward geneval: detector_path", detector_path)
        self.device = resolve_device(device)  # None: the worker's device
        self.processor = AutoImageProcessor.from_pretrained(str(p), local_files_only=True)
        self.model = AutoModelForObjectDetection.from_pretrained(str(p), local_files_only=True).eval().to(self.device)
        self.labels = {int(k): v for k, v in self.model.config.id2label.items()}
        self.min_score = float(min_score)
        self.colours = ColourClassifier(color_model_path, device) if color_model_path else None

    @torch.no_grad()
    def __call__(self, images: list[np.ndarray]) -> list[list[Detection]]:
        inputs = self.processor(images=list(images), return_tensors="pt").to(self.device)
        outputs = self.model(**inputs)
        sizes = [tuple(img.shape[:2]) for img in images]
        results = self.processor.post_process_object_detection(outputs, threshold=self.min_score, target_sizes=sizes)
        out = []
        for img, res in zip(images, results):
            h, w = img.shape[:2]
            dets = []
            for score, label, box in zip(res["scores"].tolist(), res["labels"].tolist(), res["boxes"].tolist()):
                x1, y1, x2, y2 = (float(v) for v in box)
                dets.append(Detection(self.labels.get(int(label), str(label)), float(score), (x1, y1, x2, y2)))
            if self.colours is not None and dets:
                dets = self._with_colours(img, dets, w, h)
            out.append(dets)
        return out

    def _with_colours(self, img: np.ndarray, dets: list[Detection], w: int, h: int) -> list[Detection]:
        by_class: dict[str, list[int]] = {}
        for i, d in enumerate(dets):
            by_class.setdefault(d.cls, []).append(i)
        colours: dict[int, str] = {}
        for cls, idx in by_class.items():
            crops = []
            for i in idx:
                x1, y1, x2, y2 = dets[i].box
                l, t = int(max(0, min(w - 1, x1))), int(max(0, min(h - 1, y1)))
                r, b = int(max(l + 1, min(w, round(x2)))), int(max(t + 1, min(h, round(y2))))
                crops.append(np.ascontiguousarray(img[t:b, l:r]))
            for i, c in zip(idx, self.colours(crops, cls)):
                colours[i] = c
        return [Detection(d.cls, d.score, d.box, colours[i]) for i, d in enumerate(dets)]
