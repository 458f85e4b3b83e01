"""ImageReward (Xu et al. 2023, "ImageReward: Learning and Evaluating Human Preferences for Text-to-Image
Generation"): BLIP's ViT-L image encoder, a BERT-base text encoder with cross-attention to the image tokens, and
an MLP on the [CLS] output, from the published ``ImageReward.pt`` on transformers' BLIP modules.

The published scoring (``ImageReward/ImageReward.py``, ``ImageReward.score``):

    v = ViT(x)                                    (all tokens, after the final LayerNorm; eps 1e-6)
    h = BERT(tokens, cross-attending to v)[CLS]   (bidirectional self-attention; eps 1e-12)
    r = (MLP(h) - 0.16717362830052426) / 1.0333394966054072

MLP: 768 -> 1024 -> 128 -> 64 -> 16 -> 1, dropout between the first layers, no activations (the LAION
aesthetic head's layout, ``clip_based.aesthetic_head``). Image transform (``_transform(224)``): torchvision
``Resize(224, BICUBIC)`` on the 8-bit PIL image (shorter side to 224, longer side int(224 * long / short)),
``CenterCrop(224)`` (offsets int(round((H - 224) / 2)), ...), ``ToTensor``, CLIP's mean / std. Text: BLIP's
tokenizer (``bert-base-uncased`` plus the special tokens ``[DEC]`` and ``[ENC]``), padded / truncated to 35
tokens; the input ids are used as tokenized ([CLS] first).

Keys (``blip_to_hf``): BLIP's ViT is renamed as transformers' BLIP conversion does (``_VIT_TOP``, ``_VIT_BLOCK``);
its ``med.py`` BERT keeps its keys in ``BlipTextModel``; ``mlp.layers.N`` is the head; the contrastive
projections are not used by the score and are skipped. Weights: ``ImageReward.pt`` (HF hub
``THUDM/ImageReward``); tokenizer: a local ``google-bert/bert-base-uncased`` directory. The head counts, not
stored in the weights, default to ViT-L's 16 and BERT-base's 12.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from pydantic import Field

from digenrl.rewards.clip_based import aesthetic_head
from digenrl.rewards.local_weights import (
    CLIP_MEAN, CLIP_STD, LocalWeightsOptions, LocalWeightsReward, layer_count, load_strict,
)  # fmt: skip

REWARD_MEAN = 0.16717362830052426  # ImageReward.py: self.mean
REWARD_STD = 1.0333394966054072  # ImageReward.py: self.std
MAX_TOKENS = 35  # ImageReward.score: max_length=35

_VIT = "blip.visual_encoder."
_BERT = "blip.text_encoder."
_VIT_TOP = {"cls_token": "embeddings.class_embedding", "pos_embed": "embeddings.position_embedding",
            "patch_embed.proj.weight": "embeddings.patch_embedding.weight",
            "patch_embed.proj.bias": "embeddings.patch_embedding.bias",
            "norm.weight": "post_layernorm.weight", "norm.bias": "post_layernorm.bias"}  # fmt: skip
_VIT_BLOCK = {"norm1": "layer_norm1", "norm2": "layer_norm2", "attn.qkv": "self_attn.qkv",
              "attn.proj": "self_attn.projection", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}  # fmt: skip
_SKIPPED = ("blip.vision_proj.", "blip.text_proj.", _BERT + "embeddings.position_ids")


def blip_to_hf(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``ImageReward.pt`` keys -> ``ImageRewardNet`` keys (``vision.*``, ``text.*``, ``mlp.*``). Unknown keys
    are kept as they are, so the strict load names them."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key.startswith(_SKIPPED):
            continue
        if key.startswith(_BERT):
            out["text." + key[len(_BERT) :]] = value
        elif key.startswith("mlp.layers."):
            out["mlp." + key[len("mlp.layers.") :]] = value
        elif key.startswith(_VIT + "blocks."):
            idx, _, rest = key[len(_VIT + "blocks.") :].partition(".")
            module, _, leaf = rest.rpartition(".")
            out[f"vision.encoder.layers.{idx}.{_VIT_BLOCK.get(module, module)}.{leaf}"] = value
        elif key.startswith(_VIT) and key[len(_VIT) :] in _VIT_TOP:
            out["vision." + _VIT_TOP[key[len(_VIT) :]]] = value
        else:
            out[key] = value
    return out


def blip_configs(state: dict[str, torch.Tensor], vision_heads: int, text_heads: int):
    """``BlipVisionConfig`` and ``BlipTextConfig`` read off the checkpoint's shapes."""
    from transformers import BlipTextConfig, BlipVisionConfig

    width, _, patch, _ = state[_VIT + "patch_embed.proj.weight"].shape
    grid = math.isqrt(state[_VIT + "pos_embed"].shape[1] - 1)
    vision = BlipVisionConfig(hidden_size=width, intermediate_size=state[_VIT + "blocks.0.mlp.fc1.weight"].shape[0],
                              num_hidden_layers=layer_count(state, _VIT + "blocks."), num_attention_heads=vision_heads,
                              image_size=grid * patch, patch_size=patch, hidden_act="gelu", layer_norm_eps=1e-6)  # fmt: skip
    vocab, hidden = state[_BERT + "embeddings.word_embeddings.weight"].shape
    layer0 = _BERT + "encoder.layer.0."
    text = BlipTextConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layer_count(state, _BERT + "encoder.layer."),
                          intermediate_size=state[layer0 + "intermediate.dense.weight"].shape[0],
                          encoder_hidden_size=state[layer0 + "crossattention.self.key.weight"].shape[1],
                          num_attention_heads=text_heads, hidden_act="gelu", layer_norm_eps=1e-12,
                          max_position_embeddings=state[_BERT + "embeddings.position_embeddings.weight"].shape[0],
                          is_decoder=True,  # transformers builds the cross-attention layers only for a decoder config
                          pad_token_id=0, bos_token_id=None, eos_token_id=None, sep_token_id=None)  # fmt: skip
    return vision, text


class ImageRewardNet(torch.nn.Module):
    """BLIP ViT + cross-attending BERT + MLP: the network of ``ImageReward.score`` (before normalisation)."""

    def __init__(self, vision_config, text_config):
        from transformers import BlipTextModel, BlipVisionModel

        super().__init__()
        self.vision = BlipVisionModel(vision_config)
        self.text = BlipTextModel(text_config, add_pooling_layer=False)
        self.mlp = aesthetic_head(text_config.hidden_size)

    def forward(self, pixels: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        image = self.vision(pixel_values=pixels).last_hidden_state
        image_mask = torch.ones(image.shape[:2], dtype=torch.long, device=image.device)
        out = self.text(input_ids=ids, attention_mask=mask, encoder_hidden_states=image,
                        encoder_attention_mask=image_mask, is_decoder=False)  # fmt: skip
        return self.mlp(out.last_hidden_state[:, 0].float()).squeeze(-1)


def resize_center_crop(frame, size: int):
    """torchvision ``Resize(size, BICUBIC)`` + ``CenterCrop(size)`` on an 8-bit PIL image."""
    from PIL import Image

    w, h = frame.size
    short, long = min(w, h), max(w, h)
    new_long = int(size * long / short)
    new_w, new_h = (size, new_long) if w <= h else (new_long, size)
    if (new_w, new_h) != (w, h):
        frame = frame.resize((new_w, new_h), Image.BICUBIC)
    top, left = int(round((new_h - size) / 2.0)), int(round((new_w - size) / 2.0))
    return frame.crop((left, top, left + size, top + size))


class ImageRewardOptions(LocalWeightsOptions):
    text_heads: int = Field(12, ge=1)  # BERT-base


class ImageReward(LocalWeightsReward):
    """``image_reward``: ImageReward's normalised score of (image, prompt) (see the module docstring)."""

    name = "image_reward"
    options_model = ImageRewardOptions

    def __init__(self, **options):
        from transformers import AutoTokenizer

        state = self._read(options, "an ImageReward state dict", (_VIT + "patch_embed.proj.weight",
                                                                  _BERT + "embeddings.word_embeddings.weight"))
        o = self.options
        vision, text = blip_configs(state, o.vision_heads, o.text_heads)
        with torch.device("meta"):
            net = ImageRewardNet(vision, text)
        load_strict(net, blip_to_hf(state), self.name, o.checkpoint_path)
        self.net = net.eval().to(self.device, self.dtype)
        self.net.mlp.float()  # ImageReward scores the [CLS] feature in float32
        tok = AutoTokenizer.from_pretrained(o.tokenizer_path, local_files_only=True)
        tok.add_special_tokens({"bos_token": "[DEC]"})  # BLIP's init_tokenizer
        tok.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
        if len(tok) > text.vocab_size:
            raise ValueError(f"reward image_reward: tokenizer {o.tokenizer_path!r} has {len(tok)} tokens, the "
                             f"checkpoint's text encoder {text.vocab_size}")  # fmt: skip
        self.tokenizer, self.image_size = tok, vision.image_size
        self.mean = torch.tensor(CLIP_MEAN).view(1, 3, 1, 1)
        self.std = torch.tensor(CLIP_STD).view(1, 3, 1, 1)

    def pixels(self, frames: torch.Tensor) -> torch.Tensor:
        """8-bit frames [N, 3, H, W] -> the normalised model input [N, 3, 224, 224]."""
        import numpy as np
        from PIL import Image

        arrays = frames.permute(0, 2, 3, 1).cpu().numpy()
        crops = [resize_center_crop(Image.fromarray(a), self.image_size) for a in arrays]
        x = torch.stack([torch.from_numpy(np.array(c)) for c in crops])
        x = x.permute(0, 3, 1, 2).float() / 255.0
        return ((x - self.mean) / self.std).to(self.device, self.dtype)

    def tokens(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        tok = self.tokenizer(list(texts), padding="max_length", truncation=True, max_length=MAX_TOKENS,
                             return_tensors="pt")  # fmt: skip
        return tok["input_ids"].to(self.device), tok["attention_mask"].to(self.device)

    @torch.no_grad()
    def frame_scores(self, frames: torch.Tensor, texts: Sequence[str]) -> torch.Tensor:
        return (self.net(self.pixels(frames), *self.tokens(texts)) - REWARD_MEAN) / REWARD_STD
