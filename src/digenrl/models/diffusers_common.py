"""The shared part of the diffusers policy adapters (SD3, FLUX.1, Wan2.1, Qwen-Image, HunyuanVideo).

A ``DiffusersPolicy`` holds the family pipeline object (for its text encoders, tokenizers and helper
functions) and registers two submodules: ``transformer`` (trainable; LoRA or full fine-tuning) and ``vae``
(frozen, float32). Text encoders are *not* submodules: they run only through ``encode_prompts`` (results go
to the prompt cache) and ``drop_text_encoders()`` frees them.

Velocity: every family's transformer predicts v = eps - x0 in the sigma convention of docs/architecture.md (the
diffusers flow-matching Euler step is x' = x + (sigma' - sigma) v), so ``forward`` returns the transformer
output as it is. The timestep a transformer receives is t = 1000 * sigma (SD3, Wan, HunyuanVideo) or
t / 1000 (FLUX, Qwen-Image, whose models rescale internally), exactly as the family pipelines pass it.

Family subclasses define ``spec`` and implement ``_encode_texts``, ``_transformer_call``, ``decode``,
``latent_grid`` and ``_latent_layout``; options come from ``model.options`` (pixel ``height`` / ``width`` / ``frames``,
``max_sequence_length``, ``negative_prompt``, ``load_text_encoders``, ``reference_copy``, ``prompt_cache_rows``: rows
kept in memory by the prompt cache's LRU layer, default 4096).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from digenrl.models.base import Cond, Policy
from digenrl.models.prompt_cache import PromptCache, PromptCacheMiss, encoder_identity
from digenrl.models.specs import SPECS


@dataclass(frozen=True)
class FamilySpec:
    name: str  # policy kind, e.g. "sd3"
    pipeline_class: str  # diffusers pipeline class name
    text_components: tuple[str, ...]  # text encoders and tokenizers in model_index.json
    extra_components: tuple[str, ...] = ()  # optional pipeline components never used (image encoders...)
    default_options: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, kind: str, **defaults: Any) -> "FamilySpec":
        """The spec of ``kind`` from the model registry (``models.specs``), with extra default options."""
        s = SPECS[kind]
        return cls(kind, s.pipeline_class, s.text_components, s.extra_components,
                   s.default_options() + tuple(defaults.items()))

    def options(self, model_options: dict[str, Any]) -> dict[str, Any]:
        """``model.options`` over the family defaults."""
        return {**dict(self.default_options), **dict(model_options)}

    def encoder_id(self, model_path: str, options: dict[str, Any]) -> str:
        """The prompt-cache encoder id of a model directory's text-encoder / tokenizer configs and the options that
        change the text embeddings (``max_sequence_length``)."""
        root = Path(model_path).expanduser()
        files = [p for c in self.text_components if (root / c).is_dir() for p in (root / c).glob("*.json")
                 if p.is_file()]  # fmt: skip
        return encoder_identity(self.name, files, {"max_sequence_length": options.get("max_sequence_length")})


class DiffusersPolicy(Policy):
    spec: FamilySpec

    def __init__(self, pipe, model_cfg, *, cache_dir: str | None = None, encoder_id: str | None = None):
        super().__init__()
        self.options: dict[str, Any] = self.spec.options(model_cfg.options)
        self._pipe = pipe
        self.transformer = pipe.transformer
        self.vae = pipe.vae
        self.vae.requires_grad_(False)
        self.vae.eval()
        self.scheduler_config = dict(pipe.scheduler.config)
        self.scheduler_config["_class_name"] = type(pipe.scheduler).__name__
        self.model_path = model_cfg.path
        if encoder_id is None:
            encoder_id = self._encoder_id_from_pipe()
        self.prompt_cache = PromptCache(cache_dir, encoder_id, max_rows=int(self.options.get("prompt_cache_rows", 4096)))
        self._null: Cond | None = None
        self._reference_snapshot: dict[str, torch.Tensor] | None = None
        self.latent_shape = self._latent_layout()
        self._configure_vae()
        if model_cfg.lora.enabled:
            from digenrl.models.lora import apply_lora

            apply_lora(self.transformer, model_cfg.lora, self.spec.name)
        else:
            self.transformer.requires_grad_(True)
            if self.options.get("reference_copy", True):
                from digenrl.models.lora import snapshot_weights

                self._reference_snapshot = snapshot_weights(self.transformer)

    # -- construction helpers ----------------------------------------------------------------------------
    def _configure_vae(self) -> None:
        """``model.options``: ``vae_batch`` (decode at most this many samples per VAE call), ``vae_tiling`` and
        ``vae_slicing`` (diffusers' tiled / per-sample decoding, for long or large videos)."""
        if self.options.get("vae_tiling"):
            if not hasattr(self.vae, "enable_tiling"):
                raise ValueError(f"model.options.vae_tiling: {type(self.vae).__name__} has no tiled decoding")
            self.vae.enable_tiling()
        if self.options.get("vae_slicing") and hasattr(self.vae, "enable_slicing"):
            self.vae.enable_slicing()
        bs = self.options.get("vae_batch")
        if bs is not None:
            if not isinstance(bs, int) or bs < 1:
                raise ValueError(f"model.options.vae_batch: expected a positive integer, got {bs!r}")
            family_decode = self.decode
            self.decode = lambda z: torch.cat([family_decode(z[i : i + bs]) for i in range(0, z.shape[0], bs)])

    @classmethod
    def pipeline_class(cls):
        import diffusers

        return getattr(diffusers, cls.spec.pipeline_class)

    @classmethod
    def build(cls, model_cfg) -> "DiffusersPolicy":
        """Load ``model_cfg.path`` offline and wrap it in this family policy (with the prompt cache): the registry's
        builder of the family (``models.registry``)."""
        from digenrl.models.diffusers_files import ModelFilesError, check_model_dir, load_pipeline, present_components

        spec = cls.spec
        check_model_dir(model_cfg.path, spec.name, ("transformer", "vae", "scheduler"))
        text = list(spec.text_components)
        present = present_components(model_cfg.path, text)
        want_text = model_cfg.options.get("load_text_encoders", "auto")
        cache_dir = model_cfg.prompt_cache_dir
        encoder_id = None
        if want_text is True and len(present) < len(text):
            check_model_dir(model_cfg.path, spec.name, text)  # names the missing text components
        if want_text is False or len(present) < len(text):
            ids = PromptCache.read_encoder_ids(cache_dir) if cache_dir else []
            if not ids:
                where = (
                    f"model.prompt_cache_dir {cache_dir!r} holds no prompt cache manifest"
                    if cache_dir
                    else "model.prompt_cache_dir is not set"
                )
                missing = [f"{c}/ (subfolder)" for c in text if c not in present]
                if missing:
                    raise ModelFilesError(
                        f"model directory {model_cfg.path!r} (model.kind={spec.name!r}) has no text encoders "
                        f"(missing: {', '.join(missing)}) and {where}; build one with `digenrl cache-prompts`"
                    )
                raise ValueError(f"model.options.load_text_encoders is false and {where}")
            if len(ids) > 1:
                raise ValueError(f"model.prompt_cache_dir: {cache_dir!r} holds several encoder ids {ids}; use one "
                                 "per dir")
            encoder_id, skip = ids[0], text
        else:
            skip = []
        pipe = load_pipeline(cls.pipeline_class(), model_cfg.path, model_cfg.dtype, skip + list(spec.extra_components))
        for comp in ("transformer", "vae", *spec.text_components):
            module = getattr(pipe, comp, None)
            if isinstance(module, torch.nn.Module):
                module.to(model_cfg.device)
                if comp != "transformer":
                    module.requires_grad_(False)
        return cls(pipe, model_cfg, cache_dir=cache_dir, encoder_id=encoder_id)

    def _encoder_id_from_pipe(self) -> str:
        if not self.has_text_encoders:
            raise ValueError(f"{self.spec.name}: no text encoders loaded and no prompt cache encoder id given")
        if self.model_path:
            return self.spec.encoder_id(self.model_path, self.options)
        import hashlib  # in-memory pipeline (benchmarks, tests): identity from the component configs

        blob = repr([getattr(getattr(self._pipe, c, None), "config", None) for c in self.spec.text_components])
        return f"{self.spec.name}-mem-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"

    # -- text ------------------------------------------------------------------------------------------
    @property
    def has_text_encoders(self) -> bool:
        return any(
            getattr(self._pipe, c, None) is not None for c in self.spec.text_components if c.startswith("text_encoder")
        )

    def drop_text_encoders(self) -> None:
        """Free the text encoders and tokenizers; later prompts must come from the prompt cache."""
        for c in self.spec.text_components:
            if getattr(self._pipe, c, None) is not None:
                setattr(self._pipe, c, None)
        gc.collect()

    def cache_prompts(self, texts: Sequence[str], *, drop_encoders: bool = False, batch_size: int = 16) -> int:
        """Encode every uncached prompt of ``texts`` (and the negative prompt) into the cache; return how many."""
        todo = self.prompt_cache.missing(list(texts) + [self.negative_prompt])
        if todo and not self.has_text_encoders:
            raise PromptCacheMiss(self._miss_message(todo))
        with self.prompt_cache.bulk():
            for i in range(0, len(todo), batch_size):
                chunk = todo[i : i + batch_size]
                with torch.no_grad():
                    self.prompt_cache.put(chunk, self._encode_texts(chunk))
        if drop_encoders:
            self.drop_text_encoders()
        return len(todo)

    def _miss_message(self, todo: Sequence[str]) -> str:
        where = self.prompt_cache.dir or "memory"
        return (
            f"{len(todo)} prompt(s) (e.g. {todo[0]!r}) are not in the prompt cache ({where}) and the {self.spec.name} "
            f"text encoders are not loaded; build the cache with `digenrl cache-prompts` or load the text encoders"
        )

    @property
    def negative_prompt(self) -> str:
        return str(self.options.get("negative_prompt", ""))

    def _cond_for_texts(self, texts: Sequence[str]) -> Cond:
        todo = self.prompt_cache.missing(texts)
        if todo:
            if not self.has_text_encoders:
                raise PromptCacheMiss(self._miss_message(todo))
            with torch.no_grad():
                self.prompt_cache.put(todo, self._encode_texts(todo))
        return {k: v.to(self.device) for k, v in self.prompt_cache.get(texts).items()}

    def encode_prompts(self, prompts: Sequence) -> Cond:
        return self._cond_for_texts([p.text if hasattr(p, "text") else str(p) for p in prompts])

    def null_cond(self, n: int) -> Cond:
        if self._null is None:
            self._null = self._cond_for_texts([self.negative_prompt])
        return {k: v.expand(n, *v.shape[1:]) for k, v in self._null.items()}

    # -- model -------------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.transformer.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return self.transformer.dtype

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond, guidance: float | None = None) -> torch.Tensor:
        """Velocity for latents ``x`` [B, *latent_shape] at per-sample ``sigma`` [B]."""
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=x.device).expand(x.shape[0])
        cond = {k: v.to(x.device) for k, v in cond.items()}
        with self.compute_context():
            out = self._transformer_call(x.to(self.dtype), sigma, cond, guidance)
        return self.scale_output(out.to(x.dtype))  # scaled in fp32, before the cast (fp16 underflow)

    def velocity_model(self) -> torch.nn.Module:
        return self.transformer

    def enable_activation_checkpointing(self) -> None:
        """Recompute each transformer block in backward (diffusers' ``enable_gradient_checkpointing``)."""
        if not getattr(self.transformer, "_supports_gradient_checkpointing", False):
            raise ValueError(f"train.activation_checkpointing: the {self.spec.name} transformer "
                             f"({type(self.transformer).__name__}) has no gradient checkpointing")
        self.transformer.enable_gradient_checkpointing()

    def reference(self):
        """Context manager: inside it, ``forward`` computes the frozen reference policy (KL term)."""
        from digenrl.models.lora import reference_context

        snap = self._reference_snapshot
        if snap and next(iter(snap.values())).device != self.device:  # the policy was moved after build
            snap = self._reference_snapshot = {k: v.to(self.device) for k, v in snap.items()}
        return reference_context(self.transformer, snap)

    def make_reference(self) -> "ReferenceView":
        """A policy-like view whose forward runs under ``reference()`` (used as ``ref_policy``; no weight copy
        under LoRA). ``train.context.make_reference`` picks it up."""
        return ReferenceView(self)

    # -- family hooks -------------------------------------------------------------------------------------
    def _latent_layout(self) -> tuple[int, ...]:  # pragma: no cover - interface
        raise NotImplementedError

    def _encode_texts(self, texts: Sequence[str]) -> Cond:  # pragma: no cover - interface
        raise NotImplementedError

    def _transformer_call(self, x, sigma, cond, guidance):  # pragma: no cover - interface
        raise NotImplementedError

    def _encode(self, texts: Sequence[str], **family_kwargs: Any):
        """The family pipeline's ``encode_prompt`` of ``texts`` at ``model.options.max_sequence_length``."""
        return self._pipe.encode_prompt(prompt=list(texts), device=self.device,
                                        max_sequence_length=int(self.options["max_sequence_length"]), **family_kwargs)

    def _vae_decode(self, z: torch.Tensor) -> torch.Tensor:
        """``vae.decode(z)``, mapped from [-1, 1] to [0, 1]."""
        return (self.vae.decode(z, return_dict=False)[0] / 2 + 0.5).clamp(0, 1)

    def _decode_normalised(self, z: torch.Tensor) -> torch.Tensor:
        """The Wan VAE (Wan2.1, Qwen-Image): ``vae.decode(z * latents_std + latents_mean)`` per channel of the
        video latent ``z`` [B, C, F, h, w], [-1, 1] -> [0, 1]."""
        cfg, shape = self.vae.config, (1, self.vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(cfg.latents_mean, device=z.device).view(shape)
        std = torch.tensor(cfg.latents_std, device=z.device).view(shape)
        return self._vae_decode(z * std + mean)

    def latent_grid(self):  # pragma: no cover - interface
        """The ``models.dir_checks.LatentGrid`` of the loaded modules, from the factors the family's diffusers
        pipeline derives (``vae_scale_factor``...) and the transformer's patch size."""
        raise NotImplementedError

    def sample_size(self) -> tuple[int, int, int]:
        """(height, width, frames) of ``model.options``, checked against ``latent_grid()`` by the rule ``digenrl
        check`` applies to the directory's configs before anything loads (``dir_checks.check_sample_size``)."""
        from digenrl.models.dir_checks import check_sample_size

        return check_sample_size(self.spec.name, self.options, self.latent_grid())

    def _video_layout(self) -> tuple[int, ...]:
        """[C, 1 + (F - 1) / ft, H / fs, W / fs] of a video family (fs, ft: ``latent_grid``'s factors)."""
        g = self.latent_grid()
        h, w, frames = self.sample_size()
        return (self.transformer.config.in_channels, (frames - 1) // g.temporal + 1, h // g.spatial, w // g.spatial)


class PackedPolicy(DiffusersPolicy):
    """A family that packs 2 x 2 latent pixels into a token (FLUX, Qwen-Image): latents [tokens, C] on the packed
    token grid ``grid_hw``, sigmas on the pipeline's ``linspace(1, 1/N, N)`` shifted by the token count."""

    def latent_grid(self):
        from digenrl.models.dir_checks import LatentGrid

        return LatentGrid(self._pipe.vae_scale_factor, 2, 2)

    def _latent_layout(self) -> tuple[int, ...]:
        f = self._pipe.vae_scale_factor
        h, w, _ = self.sample_size()
        self.grid_hw = (h // (2 * f), w // (2 * f))
        return (self.grid_hw[0] * self.grid_hw[1], self.transformer.config.in_channels)

    def sigmas(self, num_steps: int) -> torch.Tensor:
        from digenrl.models.diffusers_files import family_sigmas

        return family_sigmas(self.scheduler_config, num_steps, grid="linear", image_seq_len=self.latent_shape[0])

    def _unpack(self, latents: torch.Tensor) -> torch.Tensor:
        """[B, (h/2)(w/2), 4C] -> [B, C, h, w] (inverse of the pipeline's 2 x 2 packing)."""
        b, _, c4 = latents.shape
        gh, gw = self.grid_hw
        z = latents.view(b, gh, gw, c4 // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
        return z.reshape(b, c4 // 4, gh * 2, gw * 2)


class ReferenceView:
    """The frozen reference policy of a policy, sharing its modules: the policy's forward under ``swap()``
    (default ``policy.reference()``: no extra weights under LoRA). ``root``: a frozen module of its own that
    ``swap`` puts in (the sharded full fine-tuning reference, ``train.sharding``); None: the policy's."""

    def __init__(self, policy, swap=None, root: torch.nn.Module | None = None):
        self.policy, self.root = policy, root
        self._swap = swap or policy.reference
        self.latent_shape = policy.latent_shape
        self.uses_guidance_embedding = policy.uses_guidance_embedding

    def encode_prompts(self, prompts: Sequence) -> Cond:
        return self.policy.encode_prompts(prompts)

    def null_cond(self, n: int) -> Cond:
        return self.policy.null_cond(n)

    def combine_guidance(self, v_uncond, v_cond, cfg_scale):
        return self.policy.combine_guidance(v_uncond, v_cond, cfg_scale)

    def parameters(self):
        return (self.policy if self.root is None else self.root).parameters()

    def __call__(self, x, sigma, cond, guidance=None):
        with self._swap():
            return self.policy(x, sigma, cond, guidance=guidance)


class TextEncoderOnly:
    """The text encoders of a family and nothing else (no transformer, no VAE): what ``digenrl cache-prompts``
    loads to fill the prompt cache. Encodes exactly as the family policy does (its ``_encode_texts``)."""

    def __init__(self, policy_cls: type[DiffusersPolicy], model_cfg):
        import json as _json

        from digenrl.models.diffusers_files import check_model_dir, load_pipeline

        self.spec = spec = policy_cls.spec
        index = check_model_dir(model_cfg.path, spec.name, spec.text_components)
        keep = set(spec.text_components) | {"scheduler"}
        skip = [c for c, v in index.items() if not c.startswith("_") and isinstance(v, list) and c not in keep]
        self._pipe = load_pipeline(policy_cls.pipeline_class(), model_cfg.path, model_cfg.dtype, skip)
        self.options: dict[str, Any] = spec.options(model_cfg.options)
        self.model_path = model_cfg.path
        self.device = torch.device(model_cfg.device)
        for comp in spec.text_components:
            module = getattr(self._pipe, comp, None)
            if isinstance(module, torch.nn.Module):
                module.to(self.device).requires_grad_(False)
        self._encode_texts = policy_cls._encode_texts.__get__(self)
        self.has_text_encoders = True
        encoder_id = policy_cls._encoder_id_from_pipe(self)
        self.prompt_cache = PromptCache(model_cfg.prompt_cache_dir, encoder_id)
        self.loaded = sorted(c for c in _json.loads((Path(model_cfg.path).expanduser() / "model_index.json").read_text())
                             if getattr(self._pipe, c, None) is not None)  # fmt: skip

    negative_prompt, _encode = DiffusersPolicy.negative_prompt, DiffusersPolicy._encode
    cache_prompts = DiffusersPolicy.cache_prompts  # (its text encoders are loaded: no cache miss to report)
