"""The peer recipes of the ``train.algorithm`` presets (issue 23, item 6), as data: each value with its source.

* ``configs/sd35_medium_nft.yaml``: DiffusionNFT's SD3.5-Medium PickScore recipe, ``config/nft.py::sd3_pickscore``
  (through ``_get_config``) on ``config/base.py``, with the fixed settings of ``scripts/train_nft_sd3.py``.
* ``configs/flux1_dev_mixgrpo.yaml`` and ``configs/flux1_dev_mixgrpo_flash.yaml``: MixGRPO's FLUX.1-dev recipe,
  ``scripts/finetune/finetune_flux_grpo_MixGRPO{,_Flash}.sh`` with the defaults and fixed settings of
  ``fastvideo/train_grpo_flux.py``.

The values were read at the commits of ``recipe_base.SOURCES["diffusionnft"]`` / ``["mixgrpo"]``. Batch
arithmetic in the peers' terms: DiffusionNFT's ``_get_config(n_gpus=8, gradient_step_per_epoch=1)`` finds
``sample.train_batch_size`` 9 (the largest ``bsz`` <= 9 with ``48 x 24 % (8 bsz) == 0`` and ``8 bsz % 24 == 0``), so
``num_batches_per_epoch = 48 x 24 / 72 = 16`` and ``gradient_accumulation_steps = 16 / 1``: one optimizer step
per epoch. MixGRPO runs one prompt per GPU (``--train_batch_size 1`` on 4 x 8 GPUs) with 12 generations, and
steps the optimizer every ``--gradient_accumulation_steps 3`` of each GPU's 12 samples: four per step.
"""

from __future__ import annotations

from .recipe_base import SOURCES, PeerValue, Recipe, _adamw, _ema, _fastvideo_grpo, _lora, _merge, _v

NFT_CFG = "config/nft.py::sd3_pickscore"  # its _get_config(base_model="sd3", n_gpus=8, gradient_step_per_epoch=1)
NFT_BASE = "config/base.py"
NFT_SCRIPT = "scripts/train_nft_sd3.py"


def sd35_medium_nft() -> Recipe:
    g, b, s = NFT_CFG, NFT_BASE, NFT_SCRIPT
    return Recipe("sd35_medium_nft", "DiffusionNFT sd3_pickscore", SOURCES["diffusionnft"], _merge([
        _v("seed", 42, "seed = 42", b),
        _v("model.dtype", "float16", 'mixed_precision = "fp16"', b),
        _v("train.mixed_precision", "fp16", 'mixed_precision = "fp16" (fp32 LoRA weights, fp16 autocast, GradScaler)',
           b),
        _v("model.lora.enabled", True, "use_lora = True", b),
        *_lora("sd3", 32, 64, s),
        _v("model.options.height", 512, "resolution = 512", g),
        _v("model.options.width", 512, "resolution = 512", g),
        _v("model.options.max_sequence_length", 128, "compute_text_embeddings(..., max_sequence_length=128)", s),
        _v("model.options.negative_prompt", "", 'compute_text_embeddings([""], ...) (negative)', s),
        _v("sampler.num_steps", 10, "sample.num_steps = 10", g),
        _v("sampler.eval_num_steps", 40, "sample.eval_num_steps = 40", g),
        _v("sampler.cfg_scale", 1.0, "sample.guidance_scale = 1.0 (set last in _get_config: CFG-free)", g),
        _v("sampler.eval_cfg_scale", 1.0, "eval_fn: guidance_scale=config.sample.guidance_scale", s),
        _v("sampler.nft_solver", "dpmpp_2m",
           'sample.solver = "dpm2", sample.deterministic = True (DPM-Solver++ 2M, flow_grpo/diffusers_patch/solver.py)',
           g),
        _v("sampler.same_latent", False, "pipeline_with_logprob: fresh initial noise per image", s),
        _v("sampler.integer_timesteps", "sampling", "sampling: the transformer gets int(sigma * 1000); training: "
           "the float t of the forward-noised sample (as issue 40 compared it)", s),
        _v("task.prompts_file", "dataset/pickscore/train.txt", 'dataset = "dataset/pickscore" (train.txt)', g),
        _v("train.algorithm", "nft", "positive_prediction / implicit_negative_prediction, ori_policy_loss", s),
        _v("train.nft_timesteps", 9, "num_train_timesteps = int(num_steps 10 * train.timestep_fraction 0.99)", s),
        _v("train.nft_old_policy", "soft", 'decay_type = 1: sampling and old_prediction with the "old" adapter, '
           "after each epoch old <- d old + (1 - d) theta", f"{g}, {s}"),
        _v("train.nft_old_decay", (0, 0.001, 0.5), "return_decay(global_step, 1): flat 0, uprate 0.001, uphold 0.5",
           s),
        _v("train.nft_beta", 1.0, "beta = 1.0 (_get_config; 0.1 in sd3_ocr / sd3_multi_reward)", g),
        _v("train.prompts_per_step", 48, "num_groups = 48", g),
        _v("train.generations", 24, "sample.num_image_per_prompt = 24", g),
        *_adamw(b),
        _v("train.adv_clip_max", 5.0, "train.adv_clip_max = 5 (clamp, then r = (A / 5) / 2 + 0.5)", b),
        _v("train.std_mode", "global", "sample.global_std = True", b),
        _v("train.adv_baseline", "group", "per_prompt_stat_tracking = True", b),
        _v("train.adv_eps", 1e-4, "(reward - mean) / (std + 1e-4)", "flow_grpo/stat_tracking.py"),
        _v("train.adv_std_unbiased", False, "np.std (population)", "flow_grpo/stat_tracking.py"),
        _v("train.filter_zero_advantage", False, "filtered_samples = collated_samples: every sample trains", s),
        _v("train.beta_kl", 1e-4, "train.beta = 0.0001: beta * mean((v - v_ref)^2), v_ref with the LoRA disabled",
           g),
        _v("train.minibatches_per_step", 1,
           "gradient_accumulation_steps = num_batches_per_epoch 16 // gradient_step_per_epoch 1", g),
        _v("train.inner_epochs", 1, "train.num_inner_epochs = 1", b),
        *_ema(b, s, 1),
        _v("train.ema_update", "per_commit", "ema.step once per optimizer step (current_accumulated_steps % "
                                             "effective_grad_accum_steps == 0)", s),
        _v("reward", {"pickscore": 1.0}, 'reward_fn = {"pickscore": 1.0}', g),
        _v("reward.pickscore.scale", 1 / 26, "score / 26", "flow_grpo/pickscore_scorer.py"),
        _v("eval.every", 10, "eval_freq = 10", b),
        _v("eval.num_prompts", 2048, "eval_fn over the whole test split (dataset/pickscore/test.txt: 2048 prompts)",
           s),
    ]), quirks=(
        "Timesteps and noise: the reference draws each sample's training timesteps (a permutation of the sampling "
        "schedule) and the forward noise from its global torch RNG per inner epoch; here both are seeded by the "
        "trajectory (the same in every inner epoch), so the same seed does not draw the reference's cells.",
        "Minibatch order: the reference permutes the samples before cutting its 16 micro-batches; with one "
        "optimizer step per epoch the order changes nothing but the summation order.",
    ))


MIX_SH = "scripts/finetune/finetune_flux_grpo_MixGRPO.sh"
FLASH_SH = "scripts/finetune/finetune_flux_grpo_MixGRPO_Flash.sh"
MIX_PY = "fastvideo/train_grpo_flux.py"
MIX_SAMPLING = "fastvideo/utils/sampling_utils.py"


def _mixgrpo_common(sh: str, interval: int) -> list[PeerValue]:
    """The values both MixGRPO scripts share (``sh`` sets the flags; ``interval``: its ``iters_per_group``)."""
    py, third = MIX_PY, 1 / 3
    return [
        _v("seed", 714, "seed=714 (--seed)", sh),
        _v("steps", 300, "--max_train_steps 300 (the inner loop; the outer epoch loop repeats it until stopped)",
           sh),
        _v("model.dtype", "bfloat16", "--mixed_precision bf16", sh),
        _v("train.mixed_precision", "bf16", "--mixed_precision bf16 (--master_weight_type fp32, the default)", sh),
        _v("model.lora.enabled", False, "full fine-tuning: FSDP(FluxTransformer2DModel), no LoRA", py),
        _v("model.options.height", 720, "--h 720", sh),
        _v("model.options.width", 720, "--w 720", sh),
        _v("model.options.max_sequence_length", 512, "pipe.encode_prompt(...) (diffusers' default 512)",
           "fastvideo/data_preprocess/preprocess_flux_embedding.py"),
        _v("sampler.num_steps", 25, "sampling_steps=25", sh),
        _v("sampler.eval_num_steps", 50, "total_sampling_steps=50 (offline evaluation)",
           "scripts/inference/inference_flux.sh"),
        _v("sampler.kind", "flow_grpo", "--flow_grpo_sampling: flow_grpo_step in the window", sh),
        _v("sampler.noise_level", 0.7, "eta=0.7", sh),
        _v("sampler.static_shift", 3.0, "--shift 3: sd3_time_shift(shift, linspace(1, 0, T + 1))", sh),
        _v("sampler.integer_timesteps", True, "timestep_value = int(sigma * 1000); transformer(timestep=t / 1000)",
           MIX_SAMPLING),
        _v("sampler.same_latent", True, "--init_same_noise: one input_latents per prompt group", sh),
        _v("sampler.cfg_scale", 3.5, "guidance=torch.tensor([3.5]) (embedded guidance)", MIX_SAMPLING),
        _v("sampler.eval_cfg_scale", 3.5, "pipe(..., guidance_scale=3.5)", "fastvideo/sample/sample_flux.py"),
        _v("train.algorithm", "mixgrpo", '--training_strategy part: SDE only at timesteps_train, ODE elsewhere', sh),
        _v("train.window_size", 4, "group_size=4", sh),
        _v("train.window_shift_interval", interval, f"iters_per_group={interval} (--sample_strategy progressive)",
           sh),
        _v("train.window_stride", 1, "--prog_overlap --prog_overlap_step 1 (--roll_back)", sh),
        _v("train.prompts_per_step", 32, "--train_batch_size 1 x 32 GPUs (nnodes_custom=4, nproc_per_node_custom=8)",
           sh),
        _v("train.generations", 12, "--num_generations 12", sh),
        *_fastvideo_grpo(sh, py, [_v("train.clip_range", 1e-4, "--clip_range 1e-4", sh),
                                  _v("train.adv_clip_max", 5.0, "--adv_clip_max 5.0", sh)]),
        _v("train.adv_per_reward", True, 'multi_reward_mix="advantage_aggr": one group advantage per reward', sh),
        _v("train.reward_aggregation", "advantages", "advantage_aggr: advantages = sum_k w_k A_k; the loss clamps them "
           "to +-adv_clip_max and takes one clipped loss", py),
        _v("train.filter_zero_advantage", False, "no filter: every sample trains", py),
        _v("train.beta_kl", 0.0, "kl_coeff=0.0", sh),
        _v("train.minibatches_per_step", 4,
           "12 samples per GPU, optimizer.step() every gradient_accumulation_steps=3: four per step", sh),
        _v("train.minibatch_split", "generations", "one prompt per GPU: each optimizer step takes 3 of the 12 "
           "generations of every prompt", sh),
        _v("train.inner_epochs", 1, "one pass over the samples", py),
        _v("train.ema_decay", None, "--ema_decay 0.995 is parsed but no EMA is kept", py),
        _v("train.cfg_in_training", True, "grpo_one_step: the same guidance=torch.tensor([3.5])", py),
        _v("train.activation_checkpointing", True, "--gradient_checkpointing", sh),
        _v("train.sharding", "fsdp", 'FSDP(transformer, ...) (--fsdp_sharding_startegy "full")', py),
        _v("reward", {"hpsv2": third, "image_reward": third, "pickscore": third},
           'reward_model="multi_reward" (HPSClipRewardModel, ImageRewardModel, PickScoreRewardModel), '
           "weights 1.0 each normalised by their sum", py),
        _v("reward.pickscore.scale", 1.0, "logit_scale.exp() * cos (no / 26)",
           "fastvideo/models/reward_model/pick_score.py"),
        _v("runtime.checkpoint_every", 50, "--checkpointing_steps 50", sh),
    ]


_MIXGRPO_QUIRKS = (
    "Minibatch members: MixGRPO's optimizer step takes the next 3 of each GPU's 12 samples in the order it holds "
    "them; here generations 3m .. 3m + 2 of every prompt group (train.minibatch_split=generations, blocks by "
    "generation index, whose noise is independent of the index).",
    "Window end: MixGRPO truncates the window near the last trainable step (range(cur, min(cur + 4, T - 2))) and "
    "rolls back after cur > T - 2; here the window start is clamped to T - 2 - w so it stays whole. The two agree "
    "for the first (T - 2 - w) x window_shift_interval steps, i.e. for all 300 steps of the recipe.",
    "Data and noise: MixGRPO draws one prompt per GPU with DistributedSampler(seed=--sampler_seed 7144) and its "
    "noise per rank; here per (seed, step, prompt, generation), so the same seed does not draw MixGRPO's samples.",
    "Evaluation: MixGRPO evaluates offline (scripts/inference/inference_flux.sh at 1024 x 1024, 50 steps with "
    "mix_sampling_steps=30 on the trained model), not during training; here eval.every 0 evaluates before and "
    "after training at the training resolution.",
)


def flux1_dev_mixgrpo() -> Recipe:
    return Recipe("flux1_dev_mixgrpo", "MixGRPO FLUX.1-dev (finetune_flux_grpo_MixGRPO.sh)", SOURCES["mixgrpo"],
                  _merge([
                      *_mixgrpo_common(MIX_SH, 25),
                      _v("sampler.post_solver", "euler", 'dpm_algorithm_type="null": outside the window '
                                                         "flow_grpo_step(determistic=True) = latents + dt v (Euler)",
                         MIX_SAMPLING),
                  ]), quirks=_MIXGRPO_QUIRKS)


def flux1_dev_mixgrpo_flash() -> Recipe:
    return Recipe("flux1_dev_mixgrpo_flash", "MixGRPO-Flash FLUX.1-dev (finetune_flux_grpo_MixGRPO_Flash.sh)",
                  SOURCES["mixgrpo"], _merge([
                      *_mixgrpo_common(FLASH_SH, 20),
                      _v("sampler.post_solver", "dpmpp_2m",
                         'dpm_algorithm_type="dpmsolver++", dpm_solver_order=2, dpm_solver_type="midpoint", '
                         'dpm_apply_strategy="post"', FLASH_SH),
                      _v("sampler.post_compress_ratio", 0.4, "dpm_post_compress_ratio=0.4", FLASH_SH),
                  ]), quirks=_MIXGRPO_QUIRKS)


def algorithm_recipes() -> tuple[Recipe, ...]:
    return sd35_medium_nft(), flux1_dev_mixgrpo(), flux1_dev_mixgrpo_flash()
