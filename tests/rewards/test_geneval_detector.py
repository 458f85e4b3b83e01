"""The local GenEval detector: a transformers detection model and a CLIP colour classifier from local tiny
random weights, against direct computations with the same models; and the geneval reward on it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from digenrl.rewards.geneval_detectors import TEMPLATES, TransformersDetector
from digenrl.rewards.geneval_rules import COLORS
from digenrl.rewards.registry import build_reward
from digenrl.rollout.records import Prompt

LABELS = {0: "dog", 1: "cat", 2: "car"}
VOCAB = ["<pad>", "</s>", "<unk>", "a", "photo", "of", "object", "-", "colored", *LABELS.values(), *COLORS]


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    """A tiny random CLIP whose word tokenizer knows every template word and ends each text with </s>."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    import sys
    from pathlib import Path

    from transformers import PreTrainedTokenizerFast

    sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
    from tiny_diffusers import save_tiny_clip

    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<unk>"))
    tk.normalizer = normalizers.Lowercase()
    tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()])
    tk.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                  model_max_length=16)  # fmt: skip
    return save_tiny_clip(tmp_path_factory.mktemp("clip") / "clip", tok, vocab_size=len(VOCAB))


@pytest.fixture(scope="module")
def yolos_dir(tmp_path_factory):
    from transformers import YolosConfig, YolosForObjectDetection, YolosImageProcessor

    torch.manual_seed(0)
    cfg = YolosConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                      image_size=[32, 32], patch_size=8, num_detection_tokens=6, num_labels=3, id2label=LABELS,
                      label2id={v: k for k, v in LABELS.items()})  # fmt: skip
    model = YolosForObjectDetection(cfg)
    with torch.no_grad():  # spread the heads so that boxes, labels and scores differ between tokens
        for n, p in model.named_parameters():
            if n.startswith(("class_labels_classifier", "bbox_predictor")) or "detection_tokens" in n or "position" in n:
                p.normal_(0, 1.0)
    path = tmp_path_factory.mktemp("yolos") / "det"
    model.save_pretrained(path)
    YolosImageProcessor(size={"shortest_edge": 32, "longest_edge": 32}).save_pretrained(path)
    return path


def images(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (40, 48, 3), dtype=np.uint8) for _ in range(2)]


def test_detections_and_colours_match_direct_models(yolos_dir, clip_dir):
    from transformers import AutoImageProcessor, CLIPModel, CLIPProcessor, YolosForObjectDetection

    imgs = images()
    got = TransformersDetector(str(yolos_dir), str(clip_dir), min_score=0.0)(imgs)

    proc = AutoImageProcessor.from_pretrained(yolos_dir)
    model = YolosForObjectDetection.from_pretrained(yolos_dir).eval()
    with torch.no_grad():
        ref = proc.post_process_object_detection(model(**proc(images=imgs, return_tensors="pt")), threshold=0.0,
                                                 target_sizes=[(40, 48)] * 2)  # fmt: skip
    clip, cproc = CLIPModel.from_pretrained(clip_dir).eval(), CLIPProcessor.from_pretrained(clip_dir)
    assert len({d.color for dets in got for d in dets}) > 1  # the colour head discriminates
    for img, dets, r in zip(imgs, got, ref):
        assert len(dets) == len(r["scores"]) == 6
        assert [d.cls for d in dets] == [LABELS[i] for i in r["labels"].tolist()]
        torch.testing.assert_close(torch.tensor([d.score for d in dets]), r["scores"].float())
        torch.testing.assert_close(torch.tensor([d.box for d in dets]), r["boxes"].float())
        assert len({d.box for d in dets}) > 1
        for d in dets:  # GenEval's zero-shot colour: mean of normalised template embeddings, argmax
            x1, y1, x2, y2 = d.box
            l, t = int(max(0, min(47, x1))), int(max(0, min(39, y1)))
            crop = img[t : max(t + 1, min(40, round(y2))), l : max(l + 1, min(48, round(x2)))]
            with torch.no_grad():
                e = clip.get_image_features(**cproc(images=[crop], return_tensors="pt", input_data_format="channels_last"))
                e = getattr(e, "pooler_output", e)
                e = e / e.norm(dim=-1, keepdim=True)
                w = []
                for c in COLORS:
                    tok = cproc(text=[tpl.format(c=c, cls=d.cls) for tpl in TEMPLATES], padding=True, return_tensors="pt")
                    te = clip.get_text_features(input_ids=tok["input_ids"], attention_mask=tok["attention_mask"])
                    te = getattr(te, "pooler_output", te)
                    te = (te / te.norm(dim=-1, keepdim=True)).mean(0)
                    w.append(te / te.norm())
            assert d.color == COLORS[int((e @ torch.stack(w).T).argmax())]


def test_geneval_reward_on_the_local_detector(yolos_dir, clip_dir):
    r = build_reward("geneval", detector_path=str(yolos_dir), color_model_path=str(clip_dir), threshold=0.0)
    x = torch.from_numpy(np.stack(images())).permute(0, 3, 1, 2).float() / 255
    meta = {"tag": "colors", "include": [{"class": "dog", "count": 1, "color": "red"}]}
    total, parts = r.score(x, [Prompt(0, "a red dog", meta), Prompt(1, "a red dog", meta)])
    assert total.shape == (2,) and set(parts) == {"score", "strict", "correct"}
    assert ((parts["strict"] == 0) | (parts["strict"] == 1)).all()
