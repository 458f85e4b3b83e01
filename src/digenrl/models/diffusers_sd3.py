"""Stable Diffusion 3 / 3.5 (``SD3Transformer2DModel``) behind the Policy interface.

* Latent per sample: ``[C, H / f, W / f]`` (C = 16, f = VAE scale factor 8), the layout the transformer takes.
* Condition: ``prompt_embeds`` [77 + L, 4096] (two CLIP hidden states, zero-padded, then T5; L =
  ``max_sequence_length``, pipeline default 256, Flow-GRPO uses 128) and ``pooled_prompt_embeds`` [2048],
  from the pipeline's own ``encode_prompt``.
* Guidance: classifier-free guidance with the negative prompt (default "") as the unconditional condition,
  computed in one packed forward (``guided_velocity``), as ``StableDiffusion3Pipeline`` does.
* Schedule: the scheduler grid with the static ``shift`` (3.0 for SD3.5), or the dynamic mu if the scheduler
  config enables it (pipeline default max_shift 1.16).
* Decode: ``vae.decode(x / scaling_factor + shift_factor)``, mapped from [-1, 1] to [0, 1].
"""

from __future__ import annotations

from typing import Sequence

import torch

from digenrl.models.base import Cond
from digenrl.models.diffusers_common import DiffusersPolicy, FamilySpec
from digenrl.models.diffusers_files import family_sigmas


class SD3Policy(DiffusersPolicy):
    spec = FamilySpec.of("sd3")

    def latent_grid(self):
        from digenrl.models.dir_checks import LatentGrid

        p = self.transformer.config.patch_size
        return LatentGrid(self._pipe.vae_scale_factor, p, p)

    def _latent_layout(self) -> tuple[int, ...]:
        f = self._pipe.vae_scale_factor
        h, w, _ = self.sample_size()
        return (self.transformer.config.in_channels, h // f, w // f)

    def sigmas(self, num_steps: int) -> torch.Tensor:
        _, h, w = self.latent_shape
        p = self.transformer.config.patch_size
        return family_sigmas(
            self.scheduler_config, num_steps, grid="scheduler", image_seq_len=(h // p) * (w // p), default_max_shift=1.16
        )

    def _encode_texts(self, texts: Sequence[str]) -> Cond:
        pe, _, pooled, _ = self._encode(texts, prompt_2=None, prompt_3=None, do_classifier_free_guidance=False)
        return {"prompt_embeds": pe, "pooled_prompt_embeds": pooled}

    def _transformer_call(self, x, sigma, cond, guidance):
        return self.transformer(
            hidden_states=x,
            timestep=sigma * 1000.0,
            encoder_hidden_states=cond["prompt_embeds"].to(self.dtype),
            pooled_projections=cond["pooled_prompt_embeds"].to(self.dtype),
            return_dict=False,
        )[0]

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        cfg = self.vae.config
        return self._vae_decode(latents.to(self.vae.device, torch.float32) / cfg.scaling_factor
                                + (cfg.shift_factor or 0.0))
