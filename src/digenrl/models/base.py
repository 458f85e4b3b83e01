"""The policy adapter interface every generator family implements.

A *policy* wraps a velocity model (the trainable transformer), how prompts become conditions, and how final
latents become images. Conditions are ``Cond`` dicts of batch-first tensors, so the sampler and the chunked
trainer can index, repeat and concatenate them without knowing the family.

Classifier-free guidance (CFG)::

    v = v_uncond + w * (v_cond - v_uncond)

computed in one packed forward over [uncond; cond] (``guided_velocity``). Families with a guidance embedding
(FLUX.1-dev) take ``w`` inside the model instead and report ``uses_guidance_embedding = True``.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Sequence

import torch

Cond = dict[str, torch.Tensor]


def cat_cond(conds: Sequence[Cond]) -> Cond:
    keys = conds[0].keys()
    return {k: torch.cat([c[k] for c in conds], dim=0) for k in keys}


class Policy(torch.nn.Module):
    """Base class of policy adapters.

    Subclasses set ``latent_shape`` (per-sample, e.g. (C, H, W) or (C, F, H, W)) and implement:

    * ``encode_prompts(prompts) -> Cond``: conditions for a list of ``rollout.records.Prompt``;
    * ``null_cond(n) -> Cond``: the unconditional condition (CFG), ``n`` rows;
    * ``forward(x, sigma, cond, guidance=None) -> velocity``: x [B, *latent_shape], sigma [B];
    * ``decode(latents) -> images`` in [0, 1], [B, C, H, W] or [B, C, F, H, W];
    * ``sigmas(num_steps) -> Tensor`` of num_steps + 1 sigmas (the family's shift), ending at 0.
    """

    latent_shape: tuple[int, ...] = ()
    uses_guidance_embedding: bool = False
    precision = None  # ``train.precision.Precision`` set by the trainer: autocast + fp16 gradient scaling

    def compute_context(self):
        """Context of the model call: autocast under mixed precision (``train.precision``)."""
        return self.precision.autocast() if self.precision is not None else nullcontext()

    def scale_output(self, out: torch.Tensor) -> torch.Tensor:
        """The model output, with the fp16 loss scale applied to its gradient (``train.precision.ScaleGrad``)."""
        return self.precision.scale_output(out) if self.precision is not None else out

    def encode_prompts(self, prompts: Sequence) -> Cond:  # pragma: no cover - interface
        raise NotImplementedError

    def null_cond(self, n: int) -> Cond:  # pragma: no cover - interface
        raise NotImplementedError

    def decode(self, latents: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def sigmas(self, num_steps: int) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def velocity_model(self) -> torch.nn.Module:  # pragma: no cover - interface
        """The network behind ``forward`` (what a generator's inference copy casts and compiles:
        ``models.fast_generator``); its inputs are cast to its weights' dtype inside ``forward``."""
        raise NotImplementedError

    def combine_guidance(self, v_uncond: torch.Tensor, v_cond: torch.Tensor, cfg_scale: float) -> torch.Tensor:
        """CFG combination (families may rescale it, e.g. Qwen-Image's norm-preserving true CFG)."""
        return v_uncond + cfg_scale * (v_cond - v_uncond)

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """The tensors a weight publish moves (all trainable parameters; LoRA adapters only under LoRA)."""
        return {n: p.detach() for n, p in self.named_parameters() if p.requires_grad}

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy published (or checkpointed) trainable tensors in (``copy_tensors``; ``KeyError`` before any copy)."""
        copy_tensors(dict(self.named_parameters()), state, lambda problem: KeyError(f"published weights {problem}"))


def copy_tensors(params: dict[str, torch.Tensor], state: dict[str, torch.Tensor], fail, required=()) -> None:
    """Copy ``state`` into the parameters ``params`` (name -> tensor) in place, once every tensor meets a parameter
    of its shape and every name in ``required`` a tensor; else ``fail(problem)`` is raised, the problem naming the
    first offending tensors (``fail`` adds the file and the setting to fix)."""
    unknown = [k for k in state if k not in params]
    if unknown:
        raise fail(f"holds {len(unknown)} tensors this model does not have (e.g. {unknown[:3]})")
    missing = [k for k in required if k not in state]
    if missing:
        raise fail(f"lacks trained tensors the model has (e.g. {missing[:3]})")
    for k, v in state.items():
        if params[k].shape != v.shape:
            raise fail(f"has {k} of shape {tuple(v.shape)}, the model's is {tuple(params[k].shape)}")
    with torch.no_grad():
        for k, v in state.items():
            params[k].copy_(v)


def guided_velocity(
    policy: Policy,
    x: torch.Tensor,
    sigma: torch.Tensor,
    cond: Cond,
    cfg_scale: float = 1.0,
    *,
    guidance: float | None = None,
    detach_uncond: bool = False,
    integer_timesteps: bool = False,
) -> torch.Tensor:
    """Velocity after CFG (see module docstring). ``cfg_scale == 1`` is a single conditional forward.

    A family with a guidance embedding (FLUX.1-dev) gets ``guidance`` (default ``cfg_scale``) inside the model:
    Flow-GRPO feeds the sampling guidance scale there in sampling and in training alike. ``detach_uncond`` stops
    the gradient through the unconditional branch (an option of Flow-GRPO-style training). ``integer_timesteps``
    feeds the model ``int(sigma * 1000) / 1000`` (DanceGRPO's model timesteps) instead of sigma; the SDE step
    keeps the exact sigma.
    """
    if integer_timesteps:
        sigma = torch.floor(sigma * 1000) / 1000  # int() of a non-negative number
    if policy.uses_guidance_embedding:
        return policy(x, sigma, cond, guidance=cfg_scale if guidance is None else guidance)
    if cfg_scale == 1.0:
        return policy(x, sigma, cond)
    n = x.shape[0]
    both = cat_cond([policy.null_cond(n), cond])
    v = policy(torch.cat([x, x]), torch.cat([sigma, sigma]), both)
    v_uncond, v_cond = v[:n], v[n:]
    if detach_uncond:
        v_uncond = v_uncond.detach()
    return policy.combine_guidance(v_uncond, v_cond, cfg_scale)
