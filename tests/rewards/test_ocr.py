"""OCR reward: the recogniser reads text rendered with PIL (right text scores high, wrong text low), and the
Flow-GRPO scoring rule against an independent edit distance (the Levenshtein package) and hand-worked cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from digenrl.rewards.ocr import edit_distance, ocr_similarity
from digenrl.rewards.registry import build_reward
from digenrl.rollout.records import Prompt

pytest.importorskip("rapidocr_onnxruntime")


def render(text: str, size=(320, 96)) -> torch.Tensor:
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", size, (235, 230, 220))
    ImageDraw.Draw(img).text((12, 24), text, fill=(20, 20, 60), font=ImageFont.load_default(size=40))
    return torch.from_numpy(np.array(img)).permute(2, 0, 1).float() / 255.0


def test_edit_distance_matches_levenshtein_package():
    lev = pytest.importorskip("Levenshtein")
    rng = np.random.default_rng(0)
    for _ in range(200):
        a = "".join(rng.choice(list("abc d"), size=rng.integers(0, 9)))
        b = "".join(rng.choice(list("abcd"), size=rng.integers(0, 9)))
        assert edit_distance(a, b) == lev.distance(a, b)


def test_flow_grpo_scoring_rule():
    # r = 1 - min(d, len(t)) / len(t) on space-free lower-case strings; d = 0 when t is contained in s
    assert ocr_similarity("xx HELLO world yy", "hello world") == 1.0
    assert ocr_similarity("helo", "hello") == pytest.approx(1 - 1 / 5)
    assert ocr_similarity("", "hello") == 0.0
    assert ocr_similarity("qqqqqqqqqqqqqqqqqqqq", "hello") == 0.0  # distance capped at len(t)
    with pytest.raises(ValueError):
        ocr_similarity("abc", "  ")


def test_ocr_reward_on_rendered_text(capsys):
    reward = build_reward("ocr", det_limit_side_len=320, det_limit_type="max")  # images are 320 wide already
    texts = ["DigenRL 2026", "Hello World", "OPEN"]
    images = torch.stack([render(t) for t in texts] + [render("")])
    right = [Prompt(i, f'a poster with the words "{t}" in bold') for i, t in enumerate(texts)]
    right.append(Prompt(3, 'an empty wall with "Hello World" on it'))
    wrong = [Prompt(10 + i, f'a poster with the words "{t}" in bold') for i, t in enumerate(["Zebra Quokka", "2468 1357", "Banana"])]
    r_right, info = reward.score(images, right)
    r_wrong = reward(images[:3], wrong)
    with capsys.disabled():
        print(f"\nocr scores: right {r_right.tolist()} wrong {r_wrong.tolist()}")
    assert (r_right[:3] >= 0.9).all(), r_right
    assert r_right[3] == 0.0  # nothing rendered: the whole target is missing
    assert (r_wrong <= 0.35).all(), r_wrong
    assert info["exact"][:3].sum() >= 2
    default = build_reward("ocr")(images[:1], right[:1])  # RapidOCR's default detector size reads it too
    assert default.item() >= 0.9
    video = torch.stack([images[0], images[0]], dim=1).unsqueeze(0)  # [1, C, F=2, H, W]
    assert reward(video, right[:1]).item() == pytest.approx(r_right[0].item())
    # a video of [text, blank, text, blank] frames: Flow-GRPO's video OCR (every 4th frame by default; here
    # every frame) averages only the frames that score > 0; frame_reduce=mean averages all
    clip = torch.stack([images[0], images[3], images[0], images[3]], dim=1).unsqueeze(0)
    every = build_reward("ocr", det_limit_side_len=320, det_limit_type="max", frame_stride=1)
    assert every(clip, right[:1]).item() == pytest.approx(r_right[0].item())
    mean = build_reward("ocr", det_limit_side_len=320, det_limit_type="max", frame_stride=1, frame_reduce="mean")
    assert mean(clip, right[:1]).item() == pytest.approx(r_right[0].item() / 2)
    assert reward(clip, right[:1]).item() == pytest.approx(r_right[0].item())  # default stride 4: frame 0 only
    with pytest.raises(ValueError, match="no quoted text"):
        reward(images[:1], [Prompt(0, "no quotes here")])
    whole = build_reward("ocr", target="prompt", det_limit_side_len=320, det_limit_type="max")(images[2:3], [Prompt(0, "open")])
    assert whole.item() == 1.0
