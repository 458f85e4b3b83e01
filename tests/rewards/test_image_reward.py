"""ImageReward from a tiny random checkpoint in ``ImageReward.pt``'s key format (BLIP ViT + med.py BERT + MLP),
against BLIP's network written here from the raw tensors (fused qkv ViT, BERT with cross-attention,
(MLP - mean) / std)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from digenrl.rewards import image_reward as ir_mod
from digenrl.rewards.registry import RewardConfigError, build_reward, validate_reward_spec
from digenrl.rollout.records import Prompt

W_V, H_T, LAYERS, V_HEADS, T_HEADS, PATCH, IMAGE, MAX_POS = 16, 12, 2, 2, 3, 32, 224, 40
MEAN = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(1, 3, 1, 1)
STD = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(1, 3, 1, 1)
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "red", "cat", "big", "dog", "on", "the", "mat"]
PROMPTS = [Prompt(0, "a red cat"), Prompt(1, "a big dog on the mat")]


def blip_state(vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors under ImageReward.pt's keys (BLIP_Pretrain ViT + BERT, the MLP head) at toy widths."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, std=0.3):
        return torch.randn(*shape, generator=g) * std

    def lin(name, out_dim, in_dim):
        sd[name + ".weight"], sd[name + ".bias"] = r(out_dim, in_dim), r(out_dim, std=0.1)

    def ln(name, width):
        sd[name + ".weight"], sd[name + ".bias"] = 1 + r(width, std=0.1), r(width, std=0.1)

    v, t = "blip.visual_encoder.", "blip.text_encoder."
    # tiny embeddings (variance ~1e-5): the first LayerNorms' eps (1e-6 in BLIP's ViT) matter
    sd = {v + "cls_token": r(1, 1, W_V, std=1e-3), v + "pos_embed": r(1, (IMAGE // PATCH) ** 2 + 1, W_V, std=1e-3),
          v + "patch_embed.proj.weight": r(W_V, 3, PATCH, PATCH, std=5e-5), v + "patch_embed.proj.bias": r(W_V, std=1e-3),
          t + "embeddings.word_embeddings.weight": r(vocab, H_T, std=1e-3),  # and BERT's eps (1e-12)
          t + "embeddings.position_embeddings.weight": r(MAX_POS, H_T, std=1e-3),
          t + "embeddings.position_ids": torch.arange(MAX_POS).expand(1, -1)}  # fmt: skip
    ln(v + "norm", W_V)
    ln(t + "embeddings.LayerNorm", H_T)
    for i in range(LAYERS):
        b = f"{v}blocks.{i}."
        ln(b + "norm1", W_V), ln(b + "norm2", W_V)
        lin(b + "attn.qkv", 3 * W_V, W_V), lin(b + "attn.proj", W_V, W_V)
        lin(b + "mlp.fc1", 4 * W_V, W_V), lin(b + "mlp.fc2", W_V, 4 * W_V)
        b = f"{t}encoder.layer.{i}."
        for att, kv_dim in (("attention", H_T), ("crossattention", W_V)):
            lin(b + att + ".self.query", H_T, H_T)
            lin(b + att + ".self.key", H_T, kv_dim), lin(b + att + ".self.value", H_T, kv_dim)
            lin(b + att + ".output.dense", H_T, H_T), ln(b + att + ".output.LayerNorm", H_T)
        lin(b + "intermediate.dense", 4 * H_T, H_T), lin(b + "output.dense", H_T, 4 * H_T), ln(b + "output.LayerNorm", H_T)
    lin("blip.vision_proj", 256, W_V), lin("blip.text_proj", 256, H_T)  # BLIP_Pretrain's, unused by the score
    for idx, (o, i) in zip((0, 2, 4, 6, 7), ((1024, H_T), (128, 1024), (64, 128), (16, 64), (1, 16))):
        sd[f"mlp.layers.{idx}.weight"], sd[f"mlp.layers.{idx}.bias"] = r(o, i, std=i**-0.5), r(o, std=0.1)
    return sd


def _attend(q, k, v, heads, add_mask=None):
    b, n, d = q.shape
    split = lambda x: x.view(b, x.shape[1], heads, d // heads).transpose(1, 2)  # noqa: E731
    s = split(q) @ split(k).transpose(-1, -2) / (d // heads) ** 0.5
    s = s + add_mask if add_mask is not None else s
    return (s.softmax(-1) @ split(v)).transpose(1, 2).reshape(b, n, d)


def reference_image_reward(sd, pixels, ids, mask):
    """ImageReward.score: (MLP(BERT(ids | ViT(x))[CLS]) - 0.16717362830052426) / 1.0333394966054072."""
    p = lambda name: sd[name]  # noqa: E731
    lin = lambda x, n: F.linear(x, p(n + ".weight"), p(n + ".bias"))  # noqa: E731
    v, t = "blip.visual_encoder.", "blip.text_encoder."
    x = F.conv2d(pixels, p(v + "patch_embed.proj.weight"), p(v + "patch_embed.proj.bias"), stride=PATCH)
    x = torch.cat([p(v + "cls_token").expand(x.shape[0], -1, -1), x.flatten(2).transpose(1, 2)], dim=1) + p(v + "pos_embed")
    for i in range(LAYERS):
        b = f"{v}blocks.{i}."
        h = F.layer_norm(x, (W_V,), p(b + "norm1.weight"), p(b + "norm1.bias"), eps=1e-6)
        q, k, val = lin(h, b + "attn.qkv").chunk(3, dim=-1)
        x = x + lin(_attend(q, k, val, V_HEADS), b + "attn.proj")
        h = F.layer_norm(x, (W_V,), p(b + "norm2.weight"), p(b + "norm2.bias"), eps=1e-6)
        x = x + lin(F.gelu(lin(h, b + "mlp.fc1")), b + "mlp.fc2")
    image = F.layer_norm(x, (W_V,), p(v + "norm.weight"), p(v + "norm.bias"), eps=1e-6)

    def add_norm(y, res, name):
        return F.layer_norm(y + res, (H_T,), p(name + ".weight"), p(name + ".bias"), eps=1e-12)

    e = p(t + "embeddings.word_embeddings.weight")[ids] + p(t + "embeddings.position_embeddings.weight")[: ids.shape[1]]
    h = F.layer_norm(e, (H_T,), p(t + "embeddings.LayerNorm.weight"), p(t + "embeddings.LayerNorm.bias"), eps=1e-12)
    pad = ((1.0 - mask.float()) * -10000.0)[:, None, None, :]  # med.py's extended attention mask
    for i in range(LAYERS):
        b = f"{t}encoder.layer.{i}."
        a = _attend(lin(h, b + "attention.self.query"), lin(h, b + "attention.self.key"),
                    lin(h, b + "attention.self.value"), T_HEADS, pad)  # fmt: skip
        h = add_norm(lin(a, b + "attention.output.dense"), h, b + "attention.output.LayerNorm")
        c = _attend(lin(h, b + "crossattention.self.query"), lin(image, b + "crossattention.self.key"),
                    lin(image, b + "crossattention.self.value"), T_HEADS)  # fmt: skip
        h = add_norm(lin(c, b + "crossattention.output.dense"), h, b + "crossattention.output.LayerNorm")
        h = add_norm(lin(F.gelu(lin(h, b + "intermediate.dense")), b + "output.dense"), h, b + "output.LayerNorm")
    z = h[:, 0]
    for idx in (0, 2, 4, 6, 7):
        z = lin(z, f"mlp.layers.{idx}")
    return (z.squeeze(-1) - 0.16717362830052426) / 1.0333394966054072


@pytest.fixture(scope="module")
def ir_files(tmp_path_factory):
    from transformers import BertTokenizer

    root = tmp_path_factory.mktemp("image_reward")
    (root / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    BertTokenizer(str(root / "vocab.txt")).save_pretrained(root / "bert")
    sd = blip_state(len(WORDS) + 2)  # + BLIP's [DEC], [ENC]
    torch.save(sd, root / "ImageReward.pt")  # the published file: a plain state dict
    return root / "ImageReward.pt", root / "bert", sd


def options(ckpt, tok, **extra):
    return {"checkpoint_path": str(ckpt), "tokenizer_path": str(tok), "vision_heads": V_HEADS, "text_heads": T_HEADS,
            **extra}  # fmt: skip


def test_score_equals_blip_forward(ir_files):
    ckpt, tok, sd = ir_files
    reward = build_reward("image_reward", **options(ckpt, tok, batch_size=1))
    ids, mask = reward.tokens([p.text for p in PROMPTS])
    assert ids.shape == (2, 35)  # padded to ImageReward's 35 tokens
    assert ids[0, :5].tolist() == [2, 5, 6, 7, 3] and mask[0].sum() == 5  # [CLS] a red cat [SEP] [PAD]...
    assert reward.tokenizer.convert_tokens_to_ids(["[DEC]", "[ENC]"]) == [len(WORDS), len(WORDS) + 1]
    x = torch.rand(2, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(1))
    r = reward(x, PROMPTS)
    assert r.shape == (2,) and r.dtype == torch.float32
    pix = ((x * 255).round() / 255 - MEAN) / STD  # 8-bit, 224 px: Resize and CenterCrop are the identity
    with torch.no_grad():
        expected = reference_image_reward(sd, pix, ids, mask)
    torch.testing.assert_close(r, expected, atol=2e-5, rtol=1e-4)
    swapped = reward(x, PROMPTS[::-1])
    with torch.no_grad():
        torch.testing.assert_close(swapped, reference_image_reward(sd, pix, ids.flip(0), mask.flip(0)), atol=2e-5, rtol=1e-4)
    assert not torch.allclose(swapped, r, atol=1e-3)  # other prompts, other scores
    assert not torch.allclose(reward(x.flip(0), PROMPTS), r, atol=1e-3)  # other images, other scores
    video = torch.stack([x, x.flip(-1)], dim=2)
    torch.testing.assert_close(reward(video, PROMPTS), (r + reward(x.flip(-1), PROMPTS)) / 2, atol=1e-6, rtol=1e-5)


def test_resize_and_center_crop_follow_torchvision():
    """Resize(224): shorter side 224, longer int(224 * long / short); CenterCrop: offset int(round(d / 2))."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    tall = Image.fromarray(rng.integers(0, 256, (449, 300, 3), dtype=np.uint8))
    out = ir_mod.resize_center_crop(tall, 224)
    expected = tall.resize((224, 335), Image.BICUBIC).crop((0, 56, 224, 280))  # 224 * 449 / 300 = 335.2; (335 - 224) / 2 = 55.5
    assert out.size == (224, 224) and np.array_equal(np.asarray(out), np.asarray(expected))
    wide = Image.fromarray(rng.integers(0, 256, (100, 130, 3), dtype=np.uint8))
    expected = wide.resize((291, 224), Image.BICUBIC).crop((34, 0, 258, 224))  # 291.2 -> 291; 33.5 -> 34
    assert np.array_equal(np.asarray(ir_mod.resize_center_crop(wide, 224)), np.asarray(expected))


def test_checkpoint_of_another_layout_is_refused(ir_files, tmp_path):
    ckpt, tok, sd = ir_files
    broken = {k: v for k, v in sd.items() if k != "blip.text_encoder.encoder.layer.1.crossattention.self.key.bias"}
    broken["blip.itm_head.weight"] = torch.zeros(2, H_T)
    torch.save(broken, tmp_path / "broken.pt")
    with pytest.raises(ValueError, match=r"missing text\.encoder\.layer\.1\.crossattention\.self\.key\.bias.*unexpected blip\.itm_head"):
        build_reward("image_reward", **options(tmp_path / "broken.pt", tok))
    with pytest.raises(FileNotFoundError, match="tokenizer_path"):
        validate_reward_spec({"image_reward": options(ckpt, tmp_path / "no-tokenizer")})
    with pytest.raises(RewardConfigError, match=r"reward\.image_reward\.dtype"):
        validate_reward_spec({"image_reward": options(ckpt, tok, dtype="int8")})


def test_low_precision_keeps_the_head_in_float32(ir_files):
    ckpt, tok, _ = ir_files
    x = torch.rand(2, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(4))
    full = build_reward("image_reward", **options(ckpt, tok))(x, PROMPTS)
    low = build_reward("image_reward", **options(ckpt, tok, dtype="bfloat16"))
    assert low.net.vision.dtype == torch.bfloat16 and low.net.mlp[0].weight.dtype == torch.float32
    # bf16 vs float32: measured max |error| 0.0085 on these two images (0.003-0.017 over seeds 0-5); the two
    # images' scores differ by 0.11, so a tolerance of ~3.5x the measured error still fails swapped images
    tol = 0.03
    torch.testing.assert_close(low(x, PROMPTS), full, atol=tol, rtol=0)
    assert (low(x.flip(0), PROMPTS) - full).abs().max() > tol
