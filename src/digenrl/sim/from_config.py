"""A run config as the roofline's inputs (``config_model``, ``config_workload``): what ``sim.config_source`` prices.

* family: ``model.kind`` -> the sim's model preset (``presets.MODELS``, from the registry ``models.specs``), text
  tokens from ``model.options.max_sequence_length`` (SD3: 77 CLIP tokens + the T5 length, ``ModelSpec.text_tokens``);
* workload: P = ``train.prompts_per_step``, G = ``train.generations``, T = ``sampler.num_steps``, S from
  ``plan_run`` (the trained share is S / T), width / height / frames from ``model.options``; the algorithm from
  ``train.algorithm`` (``sim.algorithms``: MixGRPO's window = S, MixGRPO-Flash's ``sampler.post_compress_ratio``,
  whose shorter sampling the priced plan takes as its denoising steps; DiffusionNFT's K = S, CFG-free training);
* training: LoRA rank from ``model.lora``, FSDP from ``train.sharding``, recomputation from
  ``train.activation_checkpointing``, the publish path, shard groups, TAG inference copy and sequence-parallel
  degrees from their keys;
* memory: the roofline's (``sim.memory``); the config's own memory plan refuses a candidate first
  (``sim.config_source``: ``train.memory_check``).

``--gpus N`` keeps the config's generator : trainer ratio: N_t = max(1, round(N x t / (g + t))), N_g = N - N_t.
"""

from __future__ import annotations

from .algorithms import Algorithm
from .presets import MODELS, ModelPreset, Training, Workload, preset_of


class ConfigSimError(ValueError):
    """A config the testbed path cannot price (unknown family, bad --gpus, memory shortfall); names the key."""


def config_model(cfg) -> ModelPreset:
    """The sim's model preset of ``model.kind`` with the config's text length."""
    if cfg.model.kind not in MODELS:
        raise ConfigSimError(f"model.kind: {cfg.model.kind!r} has no roofline preset (known: "
                             f"{', '.join(MODELS)}); price it with --profile instead")
    spec = MODELS[cfg.model.kind].spec
    return preset_of(spec, spec.text_tokens(cfg.model.options.get("max_sequence_length")))


def config_training(cfg) -> Training:
    lora, t, rt = cfg.model.lora, cfg.train, cfg.runtime
    return Training(lora_rank=lora.rank if lora.enabled else 0, sharded=t.sharding == "fsdp",
                    publish=rt.publish, recompute=t.activation_checkpointing, tag_copy=cfg.tuning.tag_inference_copy,
                    shard_groups=t.shard_groups if t.sharding == "fsdp" else 1)


def config_algorithm(cfg, trained: int) -> Algorithm:
    """``train.algorithm`` as the roofline's ``Algorithm`` (S = ``trained`` from ``plan_run``)."""
    t = cfg.train
    if t.algorithm == "nft":
        return Algorithm("nft", nft_timesteps=trained, nft_old=t.nft_old_policy)
    rec = {}
    if t.old_logprob == "recompute":  # a later round's cells recompute logp_old (sim.algorithms)
        rounds = t.minibatches_per_step * t.inner_epochs
        rec = {"recompute_share": (rounds - 1) / rounds, "recompute_rounds": rounds}
    if t.algorithm == "mixgrpo":
        return Algorithm("mixgrpo", window=trained, flash_ratio=cfg.sampler.post_compress_ratio, **rec)
    return Algorithm(t.algorithm, **rec)


def config_workload(cfg, trained: int) -> Workload:
    """The roofline's ``Workload`` of ``cfg`` with S = ``trained`` (from ``plan_run``)."""
    o, t, T = cfg.model.options, cfg.train, cfg.sampler.num_steps
    m = config_model(cfg)
    h, w, f = m.spec.default_size  # the adapter's defaults
    return Workload(t.prompts_per_step, t.generations, int(o.get("width", w)), int(o.get("height", h)),
                    int(o.get("frames", f)) if m.video else 1, sampling_steps=T, timestep_fraction=trained / T,
                    training=config_training(cfg), algorithm=config_algorithm(cfg, trained),
                    trained_share=trained_share(cfg), sample_batch=cfg.sampler.batch_size)


def trained_share(cfg) -> float:
    """The share of a planned chunk's cells the trainers run: best_of_n / G, times 1 / M for sample or generation
    minibatches (``Workload.trained_share``)."""
    t = cfg.train
    share = t.best_of_n / t.generations if t.best_of_n is not None else 1.0
    return share / t.minibatches_per_step if t.minibatch_split in ("samples", "generations") else share


def pools_for(cfg, gpus: int | None) -> tuple[int, int]:
    """(generator GPUs, trainer ranks): the config's pools, or ``gpus`` GPUs in the config's ratio (module
    docstring); a sequence-parallel generator counts its GPUs."""
    g, t = cfg.runtime.generators * cfg.runtime.generator_sequence_parallel.degree, cfg.runtime.trainers
    if gpus is not None and gpus < 2:
        raise ConfigSimError(f"--gpus: need at least 2 GPUs for two pools (got {gpus})")
    if cfg.runtime.mode == "colocated":
        return 0, (t if gpus is None else gpus)
    if gpus is None:
        return g, t
    nt = max(1, min(gpus - 1, round(gpus * t / (g + t))))
    return gpus - nt, nt
