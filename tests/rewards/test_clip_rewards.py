"""CLIP-based rewards from local tiny weights, against a direct CLIPModel computation on PIL images."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
from tiny_diffusers import save_tiny_clip, word_tokenizer  # noqa: E402

from digenrl.rewards.clip_based import aesthetic_head  # noqa: E402
from digenrl.rewards.registry import build_reward  # noqa: E402
from digenrl.rollout.records import Prompt  # noqa: E402

PROMPTS = [Prompt(0, "a red cat"), Prompt(1, "a big dog")]


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    from tokenizers import processors

    tok = word_tokenizer(16)  # end every text with </s> (eos_token_id=1), where CLIP pools the text
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return save_tiny_clip(tmp_path_factory.mktemp("clip") / "clip", tok, vocab_size=14)


def direct_embeddings(path, images, texts):
    from PIL import Image
    from transformers import CLIPModel, CLIPProcessor

    model, proc = CLIPModel.from_pretrained(path).eval(), CLIPProcessor.from_pretrained(path)
    pil = [Image.fromarray((im.permute(1, 2, 0) * 255).round().byte().numpy()) for im in images]
    with torch.no_grad():
        inp = proc(text=texts, images=pil, return_tensors="pt", padding=True)
        out = model(**inp)
    return out.image_embeds / out.image_embeds.norm(dim=-1, keepdim=True), out.text_embeds / out.text_embeds.norm(
        dim=-1, keepdim=True
    ), model.logit_scale.exp().item()


def test_clipscore_and_pickscore_match_direct_clip(clip_dir):
    x = torch.rand(2, 3, 24, 24, generator=torch.Generator().manual_seed(1))
    img, txt, scale = direct_embeddings(clip_dir, x, [p.text for p in PROMPTS])
    assert not torch.allclose(txt[0], txt[1])  # the two prompts embed differently
    cos = (img * txt).sum(-1)
    clip = build_reward("clipscore", model_path=str(clip_dir))(x, PROMPTS)
    torch.testing.assert_close(clip, 2.5 * cos.clamp_min(0), atol=1e-5, rtol=1e-4)
    fg = build_reward("clipscore", model_path=str(clip_dir), variant="flow_grpo")(x, PROMPTS)
    torch.testing.assert_close(fg, scale * cos / 30, atol=1e-5, rtol=1e-4)  # flow_grpo clip_scorer.py
    pick = build_reward("pickscore", model_path=str(clip_dir), scale=0.5)(x, PROMPTS)
    torch.testing.assert_close(pick, 0.5 * scale * cos, atol=1e-5, rtol=1e-4)
    video = torch.stack([x, x.flip(-1)], dim=2)  # [B, C, F, H, W]
    img2, _, _ = direct_embeddings(clip_dir, x.flip(-1), [p.text for p in PROMPTS])
    pv = build_reward("pickscore", model_path=str(clip_dir))(video, PROMPTS)
    torch.testing.assert_close(pv, scale * ((img * txt).sum(-1) + (img2 * txt).sum(-1)) / 2, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_aesthetic_head_on_clip_embeddings(clip_dir, tmp_path, suffix):
    from safetensors.torch import save_file

    torch.manual_seed(3)
    head = aesthetic_head(8)
    state = {f"layers.{k}": v for k, v in head.state_dict().items()}
    path = tmp_path / f"head{suffix}"
    save_file(state, str(path)) if suffix == ".safetensors" else torch.save(state, path)
    x = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    img, _, _ = direct_embeddings(clip_dir, x, ["a", "a"])
    r = build_reward("aesthetic", model_path=str(clip_dir), head_path=str(path))(x, PROMPTS)
    with torch.no_grad():
        torch.testing.assert_close(r, head.eval()(img).squeeze(-1), atol=1e-5, rtol=1e-4)


def test_missing_weights_are_named(clip_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        build_reward("clipscore", model_path=str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="head.pt"):
        build_reward("aesthetic", model_path=str(clip_dir), head_path=str(tmp_path / "head.pt"))
    with pytest.raises(ValueError, match="model_path"):
        build_reward("pickscore")
