"""GenEval rules on synthetic detections (hand-worked expectations), and the reward through a local detector
factory and a detection service on loopback."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from digenrl.rewards.geneval_rules import Detection, evaluate, filter_detections, relative_position
from digenrl.rewards.registry import build_reward
from digenrl.rollout.records import Prompt


def det(cls, x, y, w=20, h=20, score=0.95, color=None):
    """A box of size w x h centred at (x, y)."""
    return Detection(cls, score, (x - w / 2, y - h / 2, x + w / 2, y + h / 2), color)


def run(dets, meta):
    return evaluate(filter_detections(dets, meta.get("tag", "")), meta)


def test_filtering_thresholds_order_cap_and_nms():
    dets = [det("dog", 10, 10, score=0.5), det("dog", 50, 50, score=0.8), det("dog", 90, 90, score=0.2)]
    kept = filter_detections(dets, "two_object")["dog"]
    assert [d.score for d in kept] == [0.8, 0.5]  # > 0.3, most confident first
    assert "dog" not in filter_detections(dets, "counting")  # counting prompts need > 0.9
    many = [det("apple", i * 30, 10, score=0.99 - i * 0.001) for i in range(20)]
    assert len(filter_detections(many, "counting")["apple"]) == 16  # max_objects
    twins = [det("cat", 50, 50, score=0.9), det("cat", 52, 50, score=0.8), det("cat", 150, 50, score=0.7)]
    assert len(filter_detections(twins, "x")["cat"]) == 3  # NMS off by default (max_overlap = 1)
    assert len(filter_detections(twins, "x", max_overlap=0.5)["cat"]) == 2


def test_relative_position_formula():
    a, b = det("a", 10, 50), det("b", 80, 50)
    # offset -70, revised -(70 - 0.1 * (20 + 20)) = -66, dx = -66 / 70 < -0.5
    assert relative_position(a, b) == {"left of"}
    assert relative_position(b, a) == {"right of"}
    assert relative_position(det("a", 50, 10), det("b", 50, 90)) == {"above"}  # y grows downwards
    assert relative_position(det("a", 50, 50), det("b", 53, 50)) == set()  # |o| = 3 < 0.1 * 40: no relation
    assert relative_position(det("a", 10, 10), det("b", 90, 90)) == {"left of", "above"}  # dx = dy = -0.66


TWO = {"tag": "two_object", "include": [{"class": "dog", "count": 1}, {"class": "cat", "count": 1}]}
COUNT = {"tag": "counting", "include": [{"class": "apple", "count": 3}], "exclude": [{"class": "apple", "count": 4}]}
COLOR = {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}]}
POS = {"tag": "position", "include": [{"class": "dog", "count": 1}, {"class": "cat", "count": 1, "position": ["left of", 0]}]}


@pytest.mark.parametrize(
    "dets,meta,correct,strict,score",
    [
        ([det("dog", 20, 20), det("cat", 80, 80)], TWO, True, True, 1.0),
        ([det("dog", 20, 20)], TWO, False, False, 0.5),  # terms (1, 1 - 1/1 = 0)
        ([det("apple", x, 10) for x in (10, 50, 90)], COUNT, True, True, 1.0),
        ([det("apple", x, 10) for x in (10, 50)], COUNT, False, False, 2 / 3),  # 1 - |3 - 2| / 3
        ([det("apple", x, 10) for x in (10, 50, 90, 130)], COUNT, False, False, 2 / 3),  # >= 3 but exclude hits
        ([det("car", 20, 20, color="red")], COLOR, True, True, 1.0),
        ([det("car", 20, 20, color="blue")], COLOR, False, False, 0.5),  # terms (count 1, colour 0)
        ([], COLOR, False, False, 0.0),  # terms (count 0, missing colour 0)
        ([det("dog", 80, 50), det("cat", 10, 50)], POS, True, True, 1.0),
        ([det("dog", 10, 50), det("cat", 80, 50)], POS, False, False, 2 / 3),  # terms (1, 1, position 0)
        ([det("dog", 80, 50), det("dog", 120, 50), det("cat", 10, 50)], POS, True, False, 0.0 + 1 / 3),
    ],
)
def test_rules_on_synthetic_detections(dets, meta, correct, strict, score):
    res = run(dets, meta)
    assert (res.correct, res.strict) == (correct, strict), res.reasons
    assert res.score == pytest.approx(score)


def test_colour_clause_without_colour_labels_is_an_error():
    with pytest.raises(ValueError, match="needs colour labels"):
        run([det("car", 20, 20)], COLOR)


def test_counting_score_can_go_negative_like_the_reference():
    meta = {"tag": "counting", "include": [{"class": "apple", "count": 1}]}
    assert run([det("apple", x, 10) for x in (10, 50, 90)], meta).score == pytest.approx(1 - 2 / 1)


# --- the reward with a detector ----------------------------------------------------------------------------
SCENES = {  # image k is filled with k / 10; the detector returns SCENES[k]
    1: [{"class": "dog", "score": 0.9, "box": [70, 40, 90, 60]}, {"class": "cat", "score": 0.9, "box": [0, 40, 20, 60]}],
    2: [{"class": "dog", "score": 0.9, "box": [0, 40, 20, 60]}, {"class": "cat", "score": 0.9, "box": [70, 40, 90, 60]}],
    3: [{"class": "car", "score": 0.95, "box": [0, 0, 10, 10], "color": "blue"}],
}


def make_detector(scenes):
    def detect(images):
        return [scenes[str(round(float(img.mean()) / 255 * 10))] for img in images]

    return detect


def images(ks):
    return torch.stack([torch.full((3, 16, 16), k / 10) for k in ks])


PROMPTS = [Prompt(0, "a cat left of a dog", POS), Prompt(1, "a cat left of a dog", POS), Prompt(2, "a red car", COLOR)]


def test_reward_with_local_detector_factory():
    r = build_reward("geneval", detector_factory="test_geneval:make_detector",
                     detector_options={"scenes": {str(k): v for k, v in SCENES.items()}})  # fmt: skip
    total, parts = r.score(images([1, 2, 3]), PROMPTS)
    torch.testing.assert_close(total, torch.tensor([1.0, 2 / 3, 0.5]))
    torch.testing.assert_close(parts["strict"], torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(parts["correct"], torch.tensor([1.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match="include"):
        r(images([1]), [Prompt(0, "no metadata")])
    with pytest.raises(ValueError, match="exactly one"):
        build_reward("geneval")


def test_reward_with_detection_service():
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):  # noqa: N802
            import base64
            import io

            import numpy as np
            from PIL import Image

            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            imgs = [np.asarray(Image.open(io.BytesIO(base64.b64decode(s)))) for s in req["images"]]
            body = json.dumps({"detections": make_detector({str(k): v for k, v in SCENES.items()})(imgs)}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        r = build_reward("geneval", detector_url=f"http://127.0.0.1:{srv.server_address[1]}/detect", reward="strict")
        torch.testing.assert_close(r(images([1, 2, 3]), PROMPTS), torch.tensor([1.0, 0.0, 0.0]))
    finally:
        srv.shutdown()
        srv.server_close()
