"""GenEval's scoring rules on detections (Ghosh et al. 2023, "GenEval: An Object-Focused Framework for
Evaluating Text-to-Image Alignment", ``evaluation/evaluate_images.py``) and Flow-GRPO's partial-credit
training reward (``reward_server/gen_eval.py`` of yifan123/reward-server).

Prompt metadata (one JSONL line of GenEval's ``evaluation_metadata.jsonl``)::

    {"tag": "two_object" | "counting" | "colors" | "position" | "color_attr" | "single_object",
     "include": [{"class": "dog", "count": 2, "color": "red"?, "position": ["left of", 0]?}, ...],
     "exclude": [{"class": "cat", "count": 1}, ...]}

Detections of one image: ``Detection(cls, score, box=(x1, y1, x2, y2), color)`` (``color``: the colour
classifier's label of the object, GenEval's CLIP zero-shot over COLORS; only needed for colour clauses).

Filtering (per class): keep confidence > ``threshold`` (0.3; 0.9 when tag == "counting"), highest first, at
most ``max_objects`` (16), greedy NMS at IoU ``max_overlap`` (1.0 = off). IoU uses GenEval's inclusive pixel
areas, (x2 - x1 + 1)(y2 - y1 + 1).

Relative position of A to B (``relative_position``): with centres c, sizes d, offset o = c_A - c_B,
o' = sign(o) * max(|o| - t (d_A + d_B), 0) (t = ``position_threshold`` = 0.1); no relation if |o'| < 1e-3
on both axes; else with (dx, dy) = o' / ||o||: "left of" if dx < -0.5, "right of" if dx > 0.5, "above" if
dy < -0.5, "below" if dy > 0.5 (image y grows downwards).

``correct`` (the GenEval benchmark): every include clause holds -- at least ``count`` objects of the class;
with a colour, at least ``count`` of the ``count`` most confident ones have that colour; with a position,
each of them stands in that relation to every object of the referenced (earlier, matched) clause -- and no
exclude clause has ``count`` or more objects.

``strict`` and ``score`` (Flow-GRPO's reward server): counts must be exact (== count). Per include clause the
score collects 1 - |count - n| / count for the number n of detected objects; if the count is wrong and the
clause has a colour or position, one 0; else a colour term 1 - |count - n_colour| / count, and a position term
1 if every pair holds, else 0. score = mean of the terms (0 without include clauses; it can be negative when
n > 2 count, as in the reference). Exclude clauses do not enter ``strict`` or ``score``. (The reference server
appends a 1 after a failed position check as well as the 0; here a failed check contributes only its 0.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
RELATIONS = ("left of", "right of", "above", "below")


@dataclass(frozen=True)
class Detection:
    cls: str
    score: float
    box: tuple[float, float, float, float]  # x1, y1, x2, y2 in pixels
    color: str | None = None


@dataclass(frozen=True)
class GenEvalResult:
    correct: bool
    strict: bool
    score: float
    reasons: tuple[str, ...]


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    def area(x1, y1, x2, y2):
        return max(x2 - x1 + 1, 0) * max(y2 - y1 + 1, 0)

    inter = area(max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3]))
    union = area(*a[:4]) + area(*b[:4]) - inter
    return inter / union if union else 0.0


def filter_detections(dets: Sequence[Detection], tag: str, threshold: float = 0.3, counting_threshold: float = 0.9,
                      max_objects: int = 16, max_overlap: float = 1.0) -> dict[str, list[Detection]]:  # fmt: skip
    """Per class, the kept detections, most confident first (see the module docstring)."""
    thr = counting_threshold if tag == "counting" else threshold
    out: dict[str, list[Detection]] = {}
    for cls in dict.fromkeys(d.cls for d in dets):
        order = sorted((d for d in dets if d.cls == cls and d.score > thr), key=lambda d: -d.score)[:max_objects]
        kept: list[Detection] = []
        while order:
            best = order.pop(0)
            kept.append(best)
            if max_overlap < 1.0:
                order = [d for d in order if iou(best.box, d.box) < max_overlap]
        if kept:
            out[cls] = kept
    return out


def relative_position(a: Detection, b: Detection, threshold: float = 0.1) -> set[str]:
    boxes = np.array([a.box, b.box], dtype=np.float64).reshape(2, 2, 2)
    centre_a, centre_b = boxes.mean(axis=1)
    dim_a, dim_b = np.abs(boxes[:, 1] - boxes[:, 0])
    offset = centre_a - centre_b
    revised = np.maximum(np.abs(offset) - threshold * (dim_a + dim_b), 0) * np.sign(offset)
    if np.all(np.abs(revised) < 1e-3):
        return set()
    dx, dy = revised / np.linalg.norm(offset)
    return {rel for rel, holds in zip(RELATIONS, (dx < -0.5, dx > 0.5, dy < -0.5, dy > 0.5)) if holds}


def _colour_hits(found: Sequence[Detection], colour: str) -> int:
    if any(d.color is None for d in found):
        raise ValueError(f"geneval: a colour clause ({colour} {found[0].cls}) needs colour labels, but the detector "
                         "gave none (its detections need a 'color' from a colour classifier)")  # fmt: skip
    return sum(d.color == colour for d in found)


def _position_ok(objs, targets, rel, threshold) -> bool:
    return all(rel in relative_position(o, t, threshold) for o in objs for t in targets)


def check_metadata(meta: Any) -> None:
    """Raise ``ValueError`` naming the first malformed part of a GenEval metadata record."""
    if not isinstance(meta, dict) or not isinstance(meta.get("include"), list):
        raise ValueError("geneval: prompt metadata needs an 'include' list (GenEval's evaluation_metadata.jsonl)")
    for kind in ("include", "exclude"):
        for i, req in enumerate(meta.get(kind, [])):
            if not isinstance(req, dict) or not isinstance(req.get("class"), str):
                raise ValueError(f"geneval: {kind}[{i}] needs a 'class' string")
            if not isinstance(req.get("count"), int) or req["count"] < 1:
                raise ValueError(f"geneval: {kind}[{i}].count must be a positive integer")
            if "color" in req and req["color"] not in COLORS:
                raise ValueError(f"geneval: {kind}[{i}].color {req['color']!r} is not one of {COLORS}")
            if "position" in req:
                pos = req["position"]
                if not (isinstance(pos, list) and len(pos) == 2 and pos[0] in RELATIONS and isinstance(pos[1], int)
                        and 0 <= pos[1] < i):  # fmt: skip
                    raise ValueError(f"geneval: {kind}[{i}].position must be [relation, index of an earlier clause]")


def evaluate(objects: dict[str, list[Detection]], meta: dict, position_threshold: float = 0.1) -> GenEvalResult:
    """``correct``, ``strict`` and ``score`` of one image (see the module docstring)."""
    check_metadata(meta)
    correct, reasons = True, []
    groups: list[list[Detection] | None] = []
    for req in meta.get("include", []):
        cls, n = req["class"], req["count"]
        found = objects.get(cls, [])[:n]
        ok = len(found) >= n
        if not ok:
            reasons.append(f"expected {cls}>={n}, found {len(found)}")
        if ok and "color" in req:
            hits = _colour_hits(found, req["color"])
            if hits < n:
                ok = False
                reasons.append(f"expected {req['color']} {cls}>={n}, found {hits}")
        if ok and "position" in req:
            rel, target = req["position"]
            if groups[target] is None or not _position_ok(found, groups[target], rel, position_threshold):
                ok = False
                reasons.append(f"expected {cls} {rel} {meta['include'][target]['class']}")
        correct &= ok
        groups.append(found if ok else None)
    for req in meta.get("exclude", []):
        if len(objects.get(req["class"], [])) >= req["count"]:
            correct = False
            reasons.append(f"expected {req['class']}<{req['count']}, found {len(objects[req['class']])}")
    strict, score = _strict_score(objects, meta, position_threshold)
    return GenEvalResult(bool(correct), strict, score, tuple(reasons))


def _strict_score(objects: dict[str, list[Detection]], meta: dict, position_threshold: float) -> tuple[bool, float]:
    strict, terms = True, []
    groups: list[list[Detection] | None] = []
    for req in meta.get("include", []):
        cls, n = req["class"], req["count"]
        found = objects.get(cls, [])
        terms.append(1 - abs(n - len(found)) / n)
        ok = len(found) == n
        if not ok and ("color" in req or "position" in req):
            terms.append(0.0)
        if ok and "color" in req:
            hits = _colour_hits(found, req["color"])
            terms.append(1 - abs(n - hits) / n)
            ok = hits == n
        if ok and "position" in req:
            rel, target = req["position"]
            ok = groups[target] is not None and _position_ok(found, groups[target], rel, position_threshold)
            terms.append(1.0 if ok else 0.0)
        strict &= ok
        groups.append(found if ok else None)
    return bool(strict), (sum(terms) / len(terms) if terms else 0.0)
