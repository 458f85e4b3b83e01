"""Qwen-Image (``QwenImageTransformer2DModel``) behind the Policy interface.

* Latent per sample: the packed sequence ``[(h / 2) * (w / 2), 4 C]`` (2 x 2 patches of the C = 16 latent,
  h = 2 * (H // (2 f)), f = 8), as ``QwenImagePipeline`` keeps it; ``decode`` unpacks it to a one-frame
  video latent for the Qwen-Image VAE.
* Condition: ``prompt_embeds`` [L, 3584] (Qwen2.5-VL hidden states after the system-prompt template) and
  ``prompt_mask`` [L] (1 = real token), zero-padded to ``max_sequence_length`` L (default 512; the pipeline
  truncates at 1024) so rows of different prompts stack. Each forward trims the batch to its longest real
  prompt; the transformer masks padded text tokens in attention, so padding never changes the output.
* Guidance: the pipeline's "true CFG" with the negative prompt (default " "), rescaled to keep the norm of
  the conditional prediction per token (``combine_guidance``)::

      v = v_u + w (v_c - v_u);   v <- v * ||v_c|| / ||v||      (norms over the channel dim)

* Schedule: ``linspace(1, 1/N, N)`` with the resolution-dependent mu (``use_dynamic_shifting``, Qwen-Image
  uses max_shift 0.9 and max_image_seq_len 8192) and ``shift_terminal`` from the scheduler config.
* Timestep: t / 1000 = sigma.
"""

from __future__ import annotations

from typing import Sequence

import torch

from digenrl.models.base import Cond
from digenrl.models.diffusers_common import FamilySpec, PackedPolicy


class QwenImagePolicy(PackedPolicy):
    spec = FamilySpec.of("qwen_image", negative_prompt=" ")

    def _encode_texts(self, texts: Sequence[str]) -> Cond:
        pe, mask = self._encode(texts)
        if mask is None:
            mask = torch.ones(pe.shape[:2], dtype=torch.long, device=pe.device)
        pad = int(self.options["max_sequence_length"]) - pe.shape[1]
        pe = torch.nn.functional.pad(pe, (0, 0, 0, pad))
        mask = torch.nn.functional.pad(mask.long(), (0, pad))
        return {"prompt_embeds": pe, "prompt_mask": mask}

    def _transformer_call(self, x, sigma, cond, guidance):
        mask = cond["prompt_mask"]
        n = max(1, int(mask.sum(dim=1).max()))
        g = None
        if self.transformer.config.guidance_embeds:
            g = torch.full((x.shape[0],), float(1.0 if guidance is None else guidance), device=x.device)
        return self.transformer(
            hidden_states=x,
            timestep=(sigma * 1000.0) / 1000.0,
            guidance=g,
            encoder_hidden_states_mask=mask[:, :n],
            encoder_hidden_states=cond["prompt_embeds"][:, :n].to(self.dtype),
            img_shapes=[[(1, *self.grid_hw)]] * x.shape[0],
            return_dict=False,
        )[0]

    def combine_guidance(self, v_uncond, v_cond, cfg_scale):
        comb = v_uncond + cfg_scale * (v_cond - v_uncond)
        return comb * (torch.norm(v_cond, dim=-1, keepdim=True) / torch.norm(comb, dim=-1, keepdim=True))

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        z = self._unpack(latents.to(self.vae.device, torch.float32)).unsqueeze(2)  # one frame
        return self._decode_normalised(z)[:, :, 0]
