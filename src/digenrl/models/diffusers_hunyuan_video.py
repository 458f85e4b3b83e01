"""HunyuanVideo (``HunyuanVideoTransformer3DModel``) behind the Policy interface.

* Latent per sample: 5-D ``[C, 1 + (F - 1) / 4, H / 8, W / 8]`` (C = 16), the layout the transformer takes.
* Condition: ``prompt_embeds`` [L, 4096] (Llama hidden states, second-to-last layer skipped as the pipeline
  does, template tokens cropped), ``prompt_mask`` [L] and ``pooled_prompt_embeds`` [768] (CLIP), from the
  pipeline's ``encode_prompt`` (padded to ``max_sequence_length`` = 256). Each forward trims trailing padding
  shared by the whole batch (masked tokens do not change the output).
* Guidance: HunyuanVideo is guidance-distilled: ``uses_guidance_embedding`` is true and the model receives
  ``guidance = 1000 * w`` (``HunyuanVideoPipeline``; DanceGRPO trains with this embedded guidance).
* Schedule: ``linspace(1, 1/N, N)`` shifted with the scheduler's static shift (7.0 in the checkpoint).
* Timestep: t = 1000 * sigma.
* Decode: ``vae.decode(x / scaling_factor)``, [-1, 1] -> [0, 1]; images are ``[B, 3, F, H, W]``.
"""

from __future__ import annotations

from typing import Sequence

import torch

from digenrl.models.base import Cond
from digenrl.models.diffusers_common import DiffusersPolicy, FamilySpec
from digenrl.models.diffusers_files import family_sigmas


class HunyuanVideoPolicy(DiffusersPolicy):
    spec = FamilySpec.of("hunyuan_video")
    uses_guidance_embedding = True

    def latent_grid(self):
        from digenrl.models.dir_checks import LatentGrid

        c = self.transformer.config
        return LatentGrid(self._pipe.vae_scale_factor_spatial, c.patch_size, c.patch_size,
                          self._pipe.vae_scale_factor_temporal, c.patch_size_t)

    def _latent_layout(self) -> tuple[int, ...]:
        return self._video_layout()

    def sigmas(self, num_steps: int) -> torch.Tensor:
        return family_sigmas(self.scheduler_config, num_steps, grid="linear")

    def _encode_texts(self, texts: Sequence[str]) -> Cond:
        pe, pooled, mask = self._encode(texts)
        return {"prompt_embeds": pe, "prompt_mask": mask.long(), "pooled_prompt_embeds": pooled}

    def _transformer_call(self, x, sigma, cond, guidance):
        mask = cond["prompt_mask"]
        n = max(1, int(mask.sum(dim=1).max()))
        g = torch.full((x.shape[0],), float(1.0 if guidance is None else guidance), device=x.device, dtype=self.dtype)
        return self.transformer(
            hidden_states=x,
            timestep=sigma * 1000.0,
            encoder_hidden_states=cond["prompt_embeds"][:, :n].to(self.dtype),
            encoder_attention_mask=mask[:, :n],
            pooled_projections=cond["pooled_prompt_embeds"].to(self.dtype),
            guidance=g * 1000.0,
            return_dict=False,
        )[0]

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self._vae_decode(latents.to(self.vae.device, torch.float32) / self.vae.config.scaling_factor)
