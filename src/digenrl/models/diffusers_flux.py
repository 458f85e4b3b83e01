"""FLUX.1 (``FluxTransformer2DModel``) behind the Policy interface.

* Latent per sample: the *packed* sequence ``[(h / 2) * (w / 2), 4 C]`` (2 x 2 latent patches flattened,
  h = 2 * (H // (2 f)), C = 16), exactly what ``FluxPipeline`` keeps between steps; ``decode`` unpacks it.
  Position ids (``img_ids`` from the latent grid, ``txt_ids`` = 0) are rebuilt in every forward.
* Condition: ``prompt_embeds`` [L, 4096] (T5, L = ``max_sequence_length``; pipeline default 512, Flow-GRPO
  uses 128) and ``pooled_prompt_embeds`` [768] (CLIP), from the pipeline's ``encode_prompt``.
* Guidance: FLUX.1-dev is guidance-distilled: ``uses_guidance_embedding`` is true and the guidance scale is
  fed to the model (``guidance`` tensor), no unconditional pass. Models without a guidance embedding
  (FLUX.1-schnell) use classifier-free guidance with the negative prompt (the pipeline's "true CFG").
* Schedule: ``sigmas = linspace(1, 1/N, N)`` shifted with the resolution-dependent mu of the packed token
  count (``use_dynamic_shifting``), as ``FluxPipeline`` passes them.
* Timestep: the transformer receives t / 1000 = sigma (it rescales internally).
* Decode: unpack, ``vae.decode(x / scaling_factor + shift_factor)``, [-1, 1] -> [0, 1].
"""

from __future__ import annotations

from typing import Sequence

import torch

from digenrl.models.base import Cond
from digenrl.models.diffusers_common import FamilySpec, PackedPolicy


class FluxPolicy(PackedPolicy):
    spec = FamilySpec.of("flux")

    def __init__(self, pipe, model_cfg, **kw):
        super().__init__(pipe, model_cfg, **kw)
        self.uses_guidance_embedding = bool(self.transformer.config.guidance_embeds)

    def _encode_texts(self, texts: Sequence[str]) -> Cond:
        pe, pooled, _ = self._encode(texts, prompt_2=None)
        return {"prompt_embeds": pe, "pooled_prompt_embeds": pooled}

    def _transformer_call(self, x, sigma, cond, guidance):
        b, dev = x.shape[0], x.device
        pe = cond["prompt_embeds"].to(self.dtype)
        img_ids = self._pipe._prepare_latent_image_ids(b, *self.grid_hw, dev, self.dtype)
        txt_ids = torch.zeros(pe.shape[1], 3, device=dev, dtype=self.dtype)
        g = None
        if self.uses_guidance_embedding:
            g = torch.full((b,), float(1.0 if guidance is None else guidance), device=dev, dtype=torch.float32)
        return self.transformer(
            hidden_states=x,
            timestep=(sigma * 1000.0) / 1000.0,
            guidance=g,
            pooled_projections=cond["pooled_prompt_embeds"].to(self.dtype),
            encoder_hidden_states=pe,
            txt_ids=txt_ids,
            img_ids=img_ids,
            return_dict=False,
        )[0]

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        cfg = self.vae.config
        z = self._unpack(latents.to(self.vae.device, torch.float32))
        return self._vae_decode(z / cfg.scaling_factor + (cfg.shift_factor or 0.0))
