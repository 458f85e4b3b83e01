"""The model, task and sampler sections (``model.*``, ``task.*``, ``sampler.*``) and sequence parallelism."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from .base import _Strict


class LoraConfig(_Strict):
    enabled: bool = False
    """Train LoRA adapters (peft) instead of every weight of the transformer."""
    rank: int = Field(32, ge=1)
    """LoRA rank r."""
    alpha: float = Field(64.0, gt=0.0)
    """LoRA alpha (the adapters are scaled by alpha / r)."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """LoRA dropout."""
    target_modules: list[str] | None = None
    """Module names the adapters wrap; null: the family's default (the Flow-GRPO recipes' targets). A list none of
    which names a module of the transformer is refused before anything loads."""


class ModelConfig(_Strict):
    kind: str = "tiny_dit"
    """The policy family: `tiny_dit` (the CPU demo), `sd3`, `flux`, `wan`, `qwen_image` or `hunyuan_video`; checked
    against the diffusers directory's `model_index.json`.
    """
    path: str | None = None  # local diffusers directory / checkpoint; None = the built-in demo base weights
    """A local checkpoint (tiny_dit) or diffusers directory; never downloaded. null: the built-in demo base weights."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """The dtype the weights are loaded in (`float32`, `bfloat16`, `float16`); see `train.mixed_precision` for fp32
    master weights.
    """
    device: str = "cpu"
    """Torch device of every worker (`cpu`, `cuda`, `cuda:N`); refused when this machine has no such device."""
    lora: LoraConfig = LoraConfig()
    """LoRA settings (`model.lora.*`)."""
    prompt_cache_dir: str | None = None
    """On-disk prompt-embedding cache (`digenrl cache-prompts` fills it; one text encoder and encoding options per
    directory). When it covers every prompt the workers do not load the text encoders.
    """
    checkpoint: str | None = None  # trained weights (a run's checkpoint.safetensors) loaded over model.path's
    """A run's `checkpoint.safetensors` loaded over `model.path` (adapters under LoRA, else full weights)."""
    lora_path: str | None = None  # a LoRA adapter to train on: PEFT dir/file (flow_grpo's save_pretrained) or diffusers
    """A LoRA adapter to train on: a PEFT directory / `adapter_model.safetensors` (Flow-GRPO's `checkpoint-N/lora`) or
    a diffusers `pytorch_lora_weights.safetensors`; sets `model.lora` (rank, alpha, targets) from it.
    """
    options: dict[str, Any] = {}  # family-specific extras (e.g. height/width/frames)
    """Family options, typed per `model.kind` (`digenrl/model_options.py`): `height`, `width`, `frames` (video),
    `max_sequence_length`, `negative_prompt`, `load_text_encoders`, `vae_batch`, `vae_tiling`, `vae_slicing`,
    `prompt_cache_rows`, `reference_copy`; an unknown option is refused with the family's list.
    """

    @model_validator(mode="after")
    def _check_options(self) -> "ModelConfig":
        """``model.options`` against the family's typed options (``digenrl.model_options``)."""
        from digenrl.model_options import check_options

        check_options(self.kind, self.options)
        return self


class TaskConfig(_Strict):
    name: str = "digits"
    """`digits` (the CPU demo's task) or `text` (prompts from `task.prompts_file`)."""
    prompts_file: str | None = None  # one prompt per line (real models), or a dataset dir (train.txt / test.txt)
    """Train prompts: one per line, JSONL with a `prompt` field (other keys kept as metadata), or a Flow-GRPO dataset
    directory (`train.txt` / `test.txt`, or `train_metadata.jsonl` / `test_metadata.jsonl`).
    """
    eval_prompts_file: str | None = None
    """Held-out eval prompts (same formats); unset: the dataset directory's test split, else the first train prompts
    (the run warns).
    """


class SamplerConfig(_Strict):
    num_steps: int = Field(10, ge=1)
    """T: denoising steps of a training trajectory."""
    eval_num_steps: int | None = Field(None, ge=1)  # default: num_steps
    """Denoising steps of the eval's ODE sampling; null: `sampler.num_steps`."""
    batch_size: int | None = Field(None, ge=1)
    """The most samples a worker draws in one sampling batch: Flow-GRPO's per-GPU `sample.train_batch_size` (its
    FLUX recipe: 3; DanceGRPO samples 1 at a time). null: as many as memory holds (the memory plan's bound under
    `train.memory_gb`, at most 64). Speed only: each sample's noise is seeded by its own ids. The simulator
    prices an action of n samples as ceil(n / batch_size) batches."""
    noise_level: float = Field(0.7, ge=0.0)
    """The SDE's noise: a (`flow_grpo`, `cps`) or eta (`dance`)."""
    kind: Literal["flow_grpo", "dance", "cps"] = "flow_grpo"
    """The SDE step: `flow_grpo` (Flow-GRPO), `dance` (DanceGRPO, constant eta) or `cps` (coefficients-preserving
    sampling).
    """
    cfg_scale: float = Field(1.0, ge=0.0)
    """Classifier-free guidance scale (also in the training forward unless `train.cfg_in_training=false`; a
    guidance-embedding model such as FLUX.1-dev always gets it).
    """
    eval_cfg_scale: float | None = Field(None, ge=0.0)  # Flow-GRPO's sample.eval_guidance_scale; None = cfg_scale
    """Guidance scale of the eval (Flow-GRPO's `sample.eval_guidance_scale`); null: `sampler.cfg_scale`."""
    static_shift: float | None = Field(None, gt=0.0)  # DanceGRPO --shift: its schedule instead of the family's
    """DanceGRPO's static sigma shift (`--shift`), replacing the family's schedule; null: the family's."""
    integer_timesteps: bool | Literal["sampling"] = False  # int(sigma * 1000) / 1000
    """Give the model int(sigma x 1000) / 1000 as DanceGRPO and MixGRPO do, in sampling and training; `sampling`: only
    while sampling, float time in training (DiffusionNFT; `train.algorithm=nft` only).
    """
    same_latent: bool = False  # one initial noise per prompt group (Flow-GRPO same_latent, DanceGRPO init_same_noise)
    """One initial noise per prompt group (Flow-GRPO `same_latent`, DanceGRPO `init_same_noise`)."""
    post_solver: Literal["euler", "dpmpp_2m"] = "euler"  # mixgrpo: ODE solver after the window (dpmpp_2m: MixGRPO-Flash)
    """`train.algorithm=mixgrpo` only: the ODE after the SDE window, `euler` or `dpmpp_2m` (DPM-Solver++ 2M,
    MixGRPO-Flash).
    """
    post_compress_ratio: float = Field(1.0, gt=0.0, le=1.0)  # mixgrpo: steps kept after the window (Flash: 0.4)
    """`train.algorithm=mixgrpo` only: the share of the steps after the window kept (MixGRPO-Flash's 0.4; below 1 needs
    `sampler.static_shift`).
    """
    nft_solver: Literal["dpmpp_2m", "euler"] = "dpmpp_2m"  # nft: its ODE (DiffusionNFT sample.solver="dpm2"; eval: Euler)
    """`train.algorithm=nft` only: the sampling ODE, `dpmpp_2m` (DiffusionNFT's `dpm2`) or `euler`; the eval samples
    with Euler.
    """


class SequenceParallelConfig(_Strict):
    """Sequence (context) parallelism of one model replica: every sample's latent tokens are split over
    ``ulysses x ring`` ranks that run each forward together (docs/sequence_parallel.md). An int ``n`` means
    ``{ulysses: n}``. Ulysses: all-to-all before and after each attention (tokens split -> heads split -> tokens
    split); ring (KV passed around the ranks) needs an attention kernel that returns the log-sum-exp, which
    diffusers' CPU/native backend does not: refused for now."""

    ulysses: int = Field(1, ge=1)
    """Ulysses degree: ranks that split the sequence and exchange it for heads around each attention."""
    ring: int = Field(1, ge=1)
    """Ring degree (refused above 1: diffusers' native attention backend returns no log-sum-exp)."""

    @model_validator(mode="before")
    @classmethod
    def _degree_shorthand(cls, value: Any) -> Any:
        return {"ulysses": value} if isinstance(value, int) and not isinstance(value, bool) else value

    @property
    def degree(self) -> int:
        """Ranks per sequence-parallel group."""
        return self.ulysses * self.ring
