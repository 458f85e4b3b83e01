"""HPSv2 from a tiny random OpenCLIP checkpoint in the published key format, against an OpenCLIP forward
written here from the raw tensors (nn.MultiheadAttention's packed in_proj, x @ proj, argmax-token pooling)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from digenrl.rewards import hpsv2 as hps_mod
from digenrl.rewards.registry import RewardConfigError, build_reward, validate_reward_spec
from digenrl.rollout.records import Prompt

W_V, W_T, EMBED, LAYERS, HEADS, PATCH, IMAGE, CONTEXT = 16, 12, 8, 2, 2, 32, 224, 77
MEAN = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(1, 3, 1, 1)  # OpenAI CLIP, open_clip constants
STD = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(1, 3, 1, 1)
PROMPTS = [Prompt(0, "a red cat"), Prompt(1, "a big dog")]


def clip_tokenizer_dir(root):
    """A CLIP BPE tokenizer over single letters (open_clip's layout: '!' = 0 pads, end-of-text has the top id)."""
    from transformers import CLIPTokenizer

    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = {"!": 0, **{c: 1 + i for i, c in enumerate(letters)}, **{c + "</w>": 27 + i for i, c in enumerate(letters)}}
    vocab.update({"!</w>": 53, "<|startoftext|>": 54, "<|endoftext|>": 55})
    (root / "vocab.json").write_text(json.dumps(vocab))
    (root / "merges.txt").write_text("#version: 0.2\n")
    CLIPTokenizer(str(root / "vocab.json"), str(root / "merges.txt"), pad_token="!").save_pretrained(root / "tok")
    return root / "tok", len(vocab)


def open_clip_state(vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors under OpenCLIP's ``CLIP`` keys (ViT-H-14's layout at toy widths)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, std=0.3):
        return torch.randn(*shape, generator=g) * std

    # tiny embeddings (variance ~1e-5): the first LayerNorms' eps (1e-5 in open_clip) matter
    sd = {"visual.conv1.weight": r(W_V, 3, PATCH, PATCH, std=5e-5), "visual.class_embedding": r(W_V, std=1e-3),
          "visual.positional_embedding": r((IMAGE // PATCH) ** 2 + 1, W_V, std=1e-3), "visual.proj": r(W_V, EMBED),
          "token_embedding.weight": r(vocab, W_T, std=1e-3), "positional_embedding": r(CONTEXT, W_T, std=1e-3),
          "text_projection": r(W_T, EMBED), "logit_scale": torch.tensor(4.6)}  # fmt: skip
    for ln, width in (("visual.ln_pre", W_V), ("visual.ln_post", W_V), ("ln_final", W_T)):
        sd[ln + ".weight"], sd[ln + ".bias"] = 1 + r(width, std=0.1), r(width, std=0.1)
    for tower, width in (("visual.transformer", W_V), ("transformer", W_T)):
        for i in range(LAYERS):
            p = f"{tower}.resblocks.{i}."
            for ln in ("ln_1", "ln_2"):
                sd[p + ln + ".weight"], sd[p + ln + ".bias"] = 1 + r(width, std=0.1), r(width, std=0.1)
            sd[p + "attn.in_proj_weight"], sd[p + "attn.in_proj_bias"] = r(3 * width, width), r(3 * width, std=0.1)
            sd[p + "attn.out_proj.weight"], sd[p + "attn.out_proj.bias"] = r(width, width), r(width, std=0.1)
            sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_fc.bias"] = r(4 * width, width), r(4 * width, std=0.1)
            sd[p + "mlp.c_proj.weight"], sd[p + "mlp.c_proj.bias"] = r(width, 4 * width), r(width, std=0.1)
    return sd


def _blocks(sd, prefix, x, mask=None):
    """OpenCLIP ResidualAttentionBlocks on [L, N, D] (sequence first, as open_clip runs them)."""
    i = 0
    while f"{prefix}.{i}.ln_1.weight" in sd:
        p = f"{prefix}.{i}."
        d = x.shape[-1]
        h = F.layer_norm(x, (d,), sd[p + "ln_1.weight"], sd[p + "ln_1.bias"])
        a, _ = F.multi_head_attention_forward(h, h, h, d, HEADS, sd[p + "attn.in_proj_weight"], sd[p + "attn.in_proj_bias"],
                                              None, None, False, 0.0, sd[p + "attn.out_proj.weight"],
                                              sd[p + "attn.out_proj.bias"], training=False, need_weights=False,
                                              attn_mask=mask)  # fmt: skip
        x = x + a
        h = F.layer_norm(x, (d,), sd[p + "ln_2.weight"], sd[p + "ln_2.bias"])
        x = x + F.linear(F.gelu(F.linear(h, sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_fc.bias"])), sd[p + "mlp.c_proj.weight"],
                         sd[p + "mlp.c_proj.bias"])  # fmt: skip
        i += 1
    return x


def reference_hps(sd, pixels, ids):
    """HPSv2's score: the diagonal of normalised image features @ normalised text features^T."""
    x = F.conv2d(pixels, sd["visual.conv1.weight"], stride=PATCH).flatten(2).transpose(1, 2)
    x = torch.cat([sd["visual.class_embedding"].expand(x.shape[0], 1, -1), x], dim=1) + sd["visual.positional_embedding"]
    x = F.layer_norm(x, (W_V,), sd["visual.ln_pre.weight"], sd["visual.ln_pre.bias"])
    x = _blocks(sd, "visual.transformer.resblocks", x.transpose(0, 1)).transpose(0, 1)
    img = F.layer_norm(x[:, 0], (W_V,), sd["visual.ln_post.weight"], sd["visual.ln_post.bias"]) @ sd["visual.proj"]
    causal = torch.full((CONTEXT, CONTEXT), float("-inf")).triu(1)
    t = sd["token_embedding.weight"][ids] + sd["positional_embedding"]
    t = _blocks(sd, "transformer.resblocks", t.transpose(0, 1), causal).transpose(0, 1)
    t = F.layer_norm(t, (W_T,), sd["ln_final.weight"], sd["ln_final.bias"])
    txt = t[torch.arange(ids.shape[0]), ids.argmax(dim=-1)] @ sd["text_projection"]
    return (F.normalize(img, dim=-1) @ F.normalize(txt, dim=-1).T).diagonal()


@pytest.fixture(scope="module")
def hps_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("hps")
    tok, vocab = clip_tokenizer_dir(root)
    sd = open_clip_state(vocab)
    torch.save({"epoch": 1, "state_dict": sd}, root / "HPS_v2.1_compressed.pt")  # the published layout
    return root / "HPS_v2.1_compressed.pt", tok, sd


def options(ckpt, tok, **extra):
    return {"checkpoint_path": str(ckpt), "tokenizer_path": str(tok), "vision_heads": HEADS, "text_heads": HEADS, **extra}


def test_tokens_are_open_clips(hps_files):
    ckpt, tok, _ = hps_files
    reward = build_reward("hpsv2", **options(ckpt, tok))
    ids = reward.tokens(["a red cat!", "x" * 200])
    assert ids.shape == (2, CONTEXT)
    c = {ch: 1 + i for i, ch in enumerate("abcdefghijklmnopqrstuvwxyz")}
    w = {ch: 27 + i for i, ch in enumerate("abcdefghijklmnopqrstuvwxyz")}
    head = [54, w["a"], c["r"], c["e"], w["d"], c["c"], c["a"], w["t"], 53, 55]  # "!" is text, not the pad token
    assert ids[0].tolist() == head + [0] * (CONTEXT - len(head))  # <sot> ... <eot>, zero padded to 77
    assert ids[1, 0] == 54 and ids[1, -1] == 55  # truncated, still ends with <eot>


def test_score_equals_open_clip_forward(hps_files):
    ckpt, tok, sd = hps_files
    reward = build_reward("hpsv2", **options(ckpt, tok, batch_size=1))
    x = torch.rand(2, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(1))
    r = reward(x, PROMPTS)
    assert r.shape == (2,) and r.dtype == torch.float32
    pix = ((x * 255).round() / 255 - MEAN) / STD  # 8-bit, 224 px: ResizeMaxSize is the identity
    ids = reward.tokens([p.text for p in PROMPTS]).cpu()
    with torch.no_grad():
        expected = reference_hps(sd, pix, ids)
    torch.testing.assert_close(r, expected, atol=2e-5, rtol=1e-4)
    swapped = reward(x, PROMPTS[::-1])  # other prompts, other scores
    with torch.no_grad():
        torch.testing.assert_close(swapped, reference_hps(sd, pix, ids.flip(0)), atol=2e-5, rtol=1e-4)
    assert not torch.allclose(swapped, r, atol=1e-3)
    assert not torch.allclose(reward(x.flip(0), PROMPTS), r, atol=1e-3)  # other images, other scores
    video = torch.stack([x, x.flip(-1)], dim=2)  # [B, C, F, H, W]: the mean over frames
    torch.testing.assert_close(reward(video, PROMPTS), (r + reward(x.flip(-1), PROMPTS)) / 2, atol=1e-6, rtol=1e-5)


def test_resize_longest_side_and_pad():
    """ResizeMaxSize: 112 x 56 -> 224 x 112 of content, 56 zero columns on each side."""
    x = torch.ones(1, 3, 112, 56)
    y = hps_mod.resize_longest_pad(x, 224)
    assert y.shape == (1, 3, 224, 224)
    assert torch.all(y[..., :56] == 0) and torch.all(y[..., 168:] == 0)
    torch.testing.assert_close(y[..., 56:168], torch.ones(1, 3, 224, 112))
    z = hps_mod.resize_longest_pad(torch.ones(1, 3, 60, 90), 224)  # 149.33 -> 149 rows; pad 75: 37 top, 38 bottom
    assert torch.all(z[..., :37, :] == 0) and torch.all(z[..., 186:, :] == 0) and torch.all(z[..., 37:186, :] > 0.99)
    reward = object.__new__(hps_mod.HpsV2)
    reward.device, reward.dtype, reward.image_size = torch.device("cpu"), torch.float32, 224
    reward.mean, reward.std = MEAN, STD
    pix = reward.pixels(torch.full((1, 3, 448, 448), 255, dtype=torch.uint8))
    torch.testing.assert_close(pix, ((torch.ones(1, 3, 224, 224) - MEAN) / STD))


def test_checkpoint_of_another_layout_is_refused(hps_files, tmp_path):
    ckpt, tok, sd = hps_files
    broken = dict(sd)
    del broken["visual.ln_post.bias"]
    broken["visual.extra_head.weight"] = torch.zeros(2)
    torch.save({"state_dict": broken}, tmp_path / "broken.pt")
    with pytest.raises(ValueError, match=r"missing vision_model\.post_layernorm\.bias.*unexpected visual\.extra_head\.weight"):
        build_reward("hpsv2", **options(tmp_path / "broken.pt", tok))
    with pytest.raises(FileNotFoundError, match="nowhere.pt"):
        validate_reward_spec({"hpsv2": options(tmp_path / "nowhere.pt", tok)})
    with pytest.raises(RewardConfigError, match=r"reward\.hpsv2\.batch_size"):
        validate_reward_spec({"hpsv2": options(ckpt, tok, batch_size=0)})
    with pytest.raises(RewardConfigError, match=r"reward\.hpsv2\.scale: unknown option"):
        validate_reward_spec({"hpsv2": options(ckpt, tok, scale=2.0)})


def test_device_default_and_low_precision(hps_files, monkeypatch):
    from digenrl.rewards.local_weights import resolve_device

    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device(None) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)  # the GPU this worker was given
    assert resolve_device(None) == torch.device("cuda", 3)
    monkeypatch.undo()
    ckpt, tok, _ = hps_files
    x = torch.rand(2, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(4))
    full = build_reward("hpsv2", **options(ckpt, tok))(x, PROMPTS)
    low = build_reward("hpsv2", **options(ckpt, tok, dtype="bfloat16"))
    assert low.model.dtype == torch.bfloat16
    # bf16 vs float32: measured max |error| 0.0032 on these two images (0.002-0.009 over seeds 0-5); the two
    # images' scores differ by 0.14, so a tolerance of ~5x the measured error still fails swapped images
    tol = 0.015
    torch.testing.assert_close(low(x, PROMPTS), full, atol=tol, rtol=0)
    assert (low(x.flip(0), PROMPTS) - full).abs().max() > tol
