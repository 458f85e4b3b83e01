"""HPSv2 / HPSv2.1 (Wu et al. 2023, "Human Preference Score v2"): a fine-tuned OpenCLIP ViT-H-14 from a local
checkpoint, run on ``transformers.CLIPModel``.

The published scoring (HPSv2's ``hpsv2/img_score.py``, also what DanceGRPO trains on) is the cosine of the
unit-normalised image and text embeddings, no logit scale:

    r = <e_img / |e_img|, e_txt / |e_txt|>,   e_img = proj_v^T ln_post(ViT(x)[cls]),
                                              e_txt = proj_t^T ln_final(T(tokens))[argmax(tokens)]

with its validation transform (``image_transform(..., resize_longest_max=True)``, ``light_augmentation``):
8-bit RGB -> [0, 1] -> resize the longer side to 224 (torchvision bicubic on the tensor, antialiased), pad the
shorter side with zeros (left/top get floor(pad / 2)) -> normalise with CLIP's mean / std. Text: the CLIP BPE
tokenizer, padded / truncated to the 77-token context; the text embedding is taken at the end-of-text token,
which open_clip finds as the highest token id.

Not ``open_clip``: ``open-clip-torch`` needs ``torchvision`` and ``timm``, whose wheels pin a torch build; its
towers are the same network as ``CLIPModel`` (pre-LN blocks, exact GELU for ViT-H-14, causal text attention),
so the state dict maps key for key (``open_clip_to_hf``) and every key must be used (``load_strict``).

Checkpoint: ``HPS_v2_compressed.pt`` or ``HPS_v2.1_compressed.pt`` (HF hub ``xswu/HPSv2``), a dict with the
OpenCLIP ``state_dict``. Tokenizer: a CLIP tokenizer directory, e.g. ``laion/CLIP-ViT-H-14-laion2B-s32B-b79K``
(its BPE is open_clip's). The head counts, not stored in the weights, default to ViT-H-14's (1280 / 80 = 16,
1024 / 64 = 16).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from digenrl.rewards.local_weights import CLIP_MEAN, CLIP_STD, LocalWeightsReward, layer_count, load_strict

_BLOCK = {  # open_clip ResidualAttentionBlock -> transformers CLIPEncoderLayer (in_proj is split separately)
    "ln_1": "layer_norm1", "ln_2": "layer_norm2", "attn.out_proj": "self_attn.out_proj",
    "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2",
}  # fmt: skip
_TOP = {
    "visual.conv1.weight": "vision_model.embeddings.patch_embedding.weight",
    "visual.class_embedding": "vision_model.embeddings.class_embedding",
    "visual.positional_embedding": "vision_model.embeddings.position_embedding.weight",
    "visual.ln_pre.weight": "vision_model.pre_layrnorm.weight",
    "visual.ln_pre.bias": "vision_model.pre_layrnorm.bias",
    "visual.ln_post.weight": "vision_model.post_layernorm.weight",
    "visual.ln_post.bias": "vision_model.post_layernorm.bias",
    "token_embedding.weight": "text_model.embeddings.token_embedding.weight",
    "positional_embedding": "text_model.embeddings.position_embedding.weight",
    "ln_final.weight": "text_model.final_layer_norm.weight",
    "ln_final.bias": "text_model.final_layer_norm.bias",
    "logit_scale": "logit_scale",
}
_TRANSPOSED = {"visual.proj": "visual_projection.weight", "text_projection": "text_projection.weight"}
_TOWERS = {"visual.transformer.resblocks.": "vision_model.encoder.layers.", "transformer.resblocks.": "text_model.encoder.layers."}
_IGNORED = ("attn_mask",)  # a buffer some open_clip versions saved; rebuilt by the model


def open_clip_to_hf(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """OpenCLIP ``CLIP`` state dict -> ``transformers.CLIPModel`` keys. Unknown keys are kept as they are, so
    the strict load names them."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key in _IGNORED:
            continue
        if key in _TOP:
            out[_TOP[key]] = value
            continue
        if key in _TRANSPOSED:
            out[_TRANSPOSED[key]] = value.t().contiguous()
            continue
        tower = next((t for t in _TOWERS if key.startswith(t)), None)
        if tower is None:
            out[key] = value
            continue
        idx, _, rest = key[len(tower) :].partition(".")
        base = f"{_TOWERS[tower]}{idx}."
        if rest in ("attn.in_proj_weight", "attn.in_proj_bias"):
            kind = rest.rsplit("_", 1)[1]  # weight | bias
            for name, part in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3, dim=0)):
                out[f"{base}self_attn.{name}.{kind}"] = part.contiguous()
            continue
        module, _, leaf = rest.rpartition(".")
        out[f"{base}{_BLOCK.get(module, module)}.{leaf}"] = value
    return out


def clip_config(state: dict[str, torch.Tensor], vision_heads: int, text_heads: int):
    """A ``CLIPConfig`` read off the OpenCLIP tensors' shapes (widths, depths, patch, image size, context)."""
    from transformers import CLIPConfig

    v_width, _, patch, _ = state["visual.conv1.weight"].shape
    grid = math.isqrt(state["visual.positional_embedding"].shape[0] - 1)
    context, t_width = state["positional_embedding"].shape
    vision = dict(hidden_size=v_width, intermediate_size=state["visual.transformer.resblocks.0.mlp.c_fc.weight"].shape[0],
                  num_hidden_layers=layer_count(state, "visual.transformer.resblocks."), num_attention_heads=vision_heads,
                  image_size=grid * patch, patch_size=patch, hidden_act="gelu", layer_norm_eps=1e-5)  # fmt: skip
    text = dict(hidden_size=t_width, intermediate_size=state["transformer.resblocks.0.mlp.c_fc.weight"].shape[0],
                num_hidden_layers=layer_count(state, "transformer.resblocks."), num_attention_heads=text_heads,
                vocab_size=state["token_embedding.weight"].shape[0], max_position_embeddings=context,
                hidden_act="gelu", layer_norm_eps=1e-5, bos_token_id=None, pad_token_id=None,
                eos_token_id=2)  # 2: transformers' legacy pooling at argmax(ids), open_clip's rule  # fmt: skip
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=state["text_projection"].shape[1])


def resize_longest_pad(x: torch.Tensor, size: int) -> torch.Tensor:
    """HPSv2's ``ResizeMaxSize``: scale s = size / max(H, W); if s != 1, bicubic (antialiased) resize to
    (round(H s), round(W s)) and zero-pad to size x size, floor(pad / 2) on the left / top."""
    h, w = x.shape[-2:]
    scale = size / float(max(h, w))
    if scale == 1.0:
        return x
    nh, nw = round(h * scale), round(w * scale)
    x = torch.nn.functional.interpolate(x, size=(nh, nw), mode="bicubic", align_corners=False, antialias=True)
    ph, pw = size - nh, size - nw
    return torch.nn.functional.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2), value=0.0)


class HpsV2(LocalWeightsReward):
    """``hpsv2``: r = cos(image, prompt) under an HPSv2 checkpoint (see the module docstring)."""

    name = "hpsv2"

    def __init__(self, **options):
        from transformers import AutoTokenizer, CLIPModel

        state = self._read(options, "an OpenCLIP state dict", ("visual.conv1.weight", "positional_embedding",
                                                               "text_projection"))  # fmt: skip
        o = self.options
        config = clip_config(state, o.vision_heads, o.text_heads)
        with torch.device("meta"):
            model = CLIPModel(config)
        load_strict(model, open_clip_to_hf(state), self.name, o.checkpoint_path)
        self.model = model.eval().to(self.device, self.dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(o.tokenizer_path, local_files_only=True)
        self.image_size, self.context = config.vision_config.image_size, config.text_config.max_position_embeddings
        self.mean = torch.tensor(CLIP_MEAN, device=self.device).view(1, 3, 1, 1)
        self.std = torch.tensor(CLIP_STD, device=self.device).view(1, 3, 1, 1)

    def pixels(self, frames: torch.Tensor) -> torch.Tensor:
        """8-bit frames [N, 3, H, W] -> the normalised model input [N, 3, 224, 224]."""
        x = resize_longest_pad(frames.to(self.device).float() / 255.0, self.image_size)
        return ((x - self.mean) / self.std).to(self.dtype)

    def tokens(self, texts: Sequence[str]) -> torch.Tensor:
        """open_clip's tokens: <sot> BPE <eot>, truncated to the context (ending with <eot>), zero padded. The
        text is never parsed for special tokens (a CLIP-H tokenizer's pad token is "!", which open_clip encodes
        as an ordinary character)."""
        rows = self.tokenizer(list(texts), max_length=self.context, truncation=True, split_special_tokens=True)
        ids = torch.zeros(len(texts), self.context, dtype=torch.long)
        for i, row in enumerate(rows["input_ids"]):
            ids[i, : len(row)] = torch.tensor(row)
        return ids.to(self.device)

    @torch.no_grad()
    def frame_scores(self, frames: torch.Tensor, texts: Sequence[str]) -> torch.Tensor:
        """The cosine of the unit image and text embeddings (float32)."""
        m, pixels, ids = self.model, self.pixels(frames), self.tokens(texts)
        img = m.visual_projection(m.vision_model(pixel_values=pixels).pooler_output)
        hidden = m.text_model(input_ids=ids).last_hidden_state  # causal attention only, as open_clip
        txt = m.text_projection(hidden[torch.arange(ids.shape[0], device=ids.device), ids.argmax(dim=-1)])
        norm = torch.nn.functional.normalize
        return (norm(img.float(), dim=-1) * norm(txt.float(), dim=-1)).sum(-1)
