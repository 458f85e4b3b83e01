"""Wan2.1 text-to-video (``WanTransformer3DModel``) behind the Policy interface.

* Latent per sample: 5-D video latents ``[C, 1 + (F - 1) / 4, H / 8, W / 8]`` (C = 16; the VAE compresses
  time 4x and space 8x), the layout the transformer takes.
* Condition: ``prompt_embeds`` [512, 4096] (UMT5 hidden states of the real tokens, zero-padded to
  ``max_sequence_length`` = 512 as ``WanPipeline`` does; the zeros are part of the model input).
* Guidance: classifier-free guidance with the negative prompt (default "") as the unconditional condition.
* Schedule: the Euler flow-matching schedule with the scheduler's static shift. Wan2.1 checkpoints ship a
  ``UniPCMultistepScheduler`` with ``flow_shift`` (3.0 at 480p, 5.0 at 720p); we sample with the (SDE-)Euler
  step at ``shift = flow_shift``, like Flow-GRPO's Wan recipe. With a ``FlowMatchEulerDiscreteScheduler``
  config the ODE path equals ``WanPipeline`` with that scheduler.
* Timestep: t = 1000 * sigma.
* Decode: ``x * latents_std + latents_mean`` per channel, ``vae.decode``, [-1, 1] -> [0, 1]; images are
  ``[B, 3, F, H, W]``.
"""

from __future__ import annotations

from typing import Sequence

import torch

from digenrl.models.base import Cond
from digenrl.models.diffusers_common import DiffusersPolicy, FamilySpec
from digenrl.models.diffusers_files import family_sigmas


class WanPolicy(DiffusersPolicy):
    spec = FamilySpec.of("wan")

    def latent_grid(self):
        from digenrl.models.dir_checks import LatentGrid

        pt, ph, pw = self.transformer.config.patch_size
        return LatentGrid(self._pipe.vae_scale_factor_spatial, ph, pw, self._pipe.vae_scale_factor_temporal, pt)

    def _latent_layout(self) -> tuple[int, ...]:
        return self._video_layout()

    def sigmas(self, num_steps: int) -> torch.Tensor:
        return family_sigmas(self.scheduler_config, num_steps, grid="scheduler")

    def _encode_texts(self, texts: Sequence[str]) -> Cond:
        pe, _ = self._encode(texts, negative_prompt=None, do_classifier_free_guidance=False)
        return {"prompt_embeds": pe}

    def _transformer_call(self, x, sigma, cond, guidance):
        return self.transformer(
            hidden_states=x,
            timestep=sigma * 1000.0,
            encoder_hidden_states=cond["prompt_embeds"].to(self.dtype),
            return_dict=False,
        )[0]

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self._decode_normalised(latents.to(self.vae.device, torch.float32))

    @classmethod
    def build(cls, model_cfg) -> "WanPolicy":
        check_not_moe(model_cfg.path)
        policy = super().build(model_cfg)
        if policy.scheduler_config.get("_class_name") == "UniPCMultistepScheduler":
            import warnings

            warnings.warn(
                f"wan: the checkpoint's scheduler is UniPCMultistepScheduler (flow_shift="
                f"{policy.scheduler_config.get('flow_shift')}); DigenRL samples with the (SDE-)Euler flow-matching step "
                "on the shifted sigma grid (Flow-GRPO's Wan recipe), so samples differ from WanPipeline's UniPC output",
                UserWarning, stacklevel=2)
        return policy


def check_not_moe(path: str | None) -> None:
    """Refuse a Wan2.2 mixture-of-experts checkpoint (``transformer_2`` + ``boundary_ratio``): DigenRL trains
    and samples one transformer; running only the high-noise expert would silently change the model."""
    import json
    from pathlib import Path

    index = Path(path or "").expanduser() / "model_index.json"
    if not index.is_file():
        return
    meta = json.loads(index.read_text())
    t2 = meta.get("transformer_2")
    has_t2 = isinstance(t2, list) and any(t2)
    if has_t2 or meta.get("boundary_ratio") is not None:
        raise ValueError(
            f"model.path: {path!r} is a Wan2.2 mixture-of-experts checkpoint (transformer_2={t2}, "
            f"boundary_ratio={meta.get('boundary_ratio')}); two-expert sampling and training are not supported: "
            "use a single-transformer Wan2.1 / Wan2.2-TI2V-5B checkpoint"
        )
