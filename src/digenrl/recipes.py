"""The peer recipes the shipped presets (``configs/*.yaml``) follow, as data: each value with its source.

Every entry maps one setting of a peer recipe (Flow-GRPO's ``config/grpo.py`` configs on top of
``config/base.py`` and the training scripts; DanceGRPO's fine-tuning script and ``train_grpo_*.py``) onto one
DigenRL config key, with the peer's value in DigenRL's terms (``sample.global_std = True`` is ``train.std_mode:
global``; ``num_batches_per_epoch / gradient_accumulation_steps`` optimizer steps per epoch is
``train.minibatches_per_step``), read at the commits of ``SOURCES`` (nothing of their code is copied). A preset
equals its recipe key by key except where its YAML marks the key ``# DEVIATION: <reason>`` (``recipe_check``).
``quirks`` name peer behaviours that no DigenRL key selects (described, not compared); a preset leaves a
micro-batch habit that is arguably a bug off (``train.micro_batch``, ``ema_update``, ``zero_adv_refill``,
``minibatch_split``), with its DEVIATION mark.
"""

from __future__ import annotations

from .recipe_base import SOURCES, PeerValue, Recipe, _adamw, _ema, _fastvideo_grpo, _lora, _merge, _v

BASE = "config/base.py"
GRPO = "config/grpo.py"


def _flow_grpo_common(cfg: str, script: str) -> list[PeerValue]:
    """Flow-GRPO settings every config here inherits (config/base.py, its stat tracker and its scripts)."""
    g = f"{GRPO}::{cfg}"
    return [
        _v("seed", 42, "seed = 42", BASE),
        _v("model.lora.enabled", True, "use_lora = True", f"{BASE}, {g} (compressibility)"),
        _v("sampler.kind", "flow_grpo", "sde_step_with_logprob (flow_grpo/diffusers_patch)", script),
        *_adamw(BASE),
        _v("train.clip_range", 1e-4, "train.clip_range = 1e-4", BASE),
        _v("train.adv_clip_max", 5.0, "train.adv_clip_max = 5", BASE),
        _v("train.adv_baseline", "group", "per_prompt_stat_tracking = True", g),
        _v("train.adv_eps", 1e-4, "(reward - mean) / (std + 1e-4)", "flow_grpo/stat_tracking.py"),
        _v("train.adv_std_unbiased", False, "np.std (population)", "flow_grpo/stat_tracking.py"),
        _v("train.filter_zero_advantage", True, "mask = advantages.abs().sum(dim=1) != 0", script),
        _v("train.kl_form", "flow_grpo", "kl = mean((mu - mu_ref)^2) / (2 std_dev_t^2)", script),
        _v("train.inner_epochs", 1, "train.num_inner_epochs = 1", g),
        _v("train.cfg_in_training", True, "train.cfg = True", BASE),
        _v("sampler.same_latent", False, "sample.same_latent = False", g),
    ]


def _micro_batch_quirks(script: str, cfg: str, *, per_gpu: int, gpus: int, ema_k: int | None, refill: bool,
                        permuted: bool, gpu_note: str = "") -> list[PeerValue]:
    """The named options of Flow-GRPO's micro-batch habits (``train.micro_batch``, ``ema_update``,
    ``zero_adv_refill``, ``minibatch_split``; train/ema.py and train/step_math.py quote the code), and its
    per-GPU sampling batch (``sampler.batch_size``). ``ema_k``: its micro-batches per optimizer step (None: no
    EMA in the recipe)."""
    g = f"{GRPO}::{cfg}"
    out = [_v("train.micro_batch", per_gpu * gpus, f"sample.train_batch_size {per_gpu} x {gpus} GPUs{gpu_note} "
                                                   f"(samples_batched[i] on every GPU)", g),
           _v("sampler.batch_size", per_gpu, f"sample.train_batch_size = {per_gpu}: the images a GPU samples at once",
              g)]
    if ema_k is not None:
        out.append(_v("train.ema_update", "per_micro_batch",
                      f"ema.step(params, global_step) once per micro-batch: k = {ema_k} per optimizer step", script))
    if refill:
        out.append(_v("train.zero_adv_refill", True, "mask[false_indices[torch.randperm(...)[:num_to_change]]] = True "
                                                      "(kept count a multiple of num_batches_per_epoch)", script))
    else:
        out.append(_v("train.zero_adv_refill", False, "no zero-advantage filter, nothing re-added", script))
    if permuted:
        out.append(_v("train.minibatch_split", "samples",
                      "perm = torch.randperm(total_batch_size) per inner epoch (each GPU's samples)", script))
    else:
        out.append(_v("train.minibatch_split", "groups", "no permutation: micro-batch i is sampling batch i, whole "
                                                          "prompt groups over the GPUs (DistributedKRepeatSampler)",
                      script))
    return out


def _no_filter(script: str) -> PeerValue:
    return _v("train.filter_zero_advantage", False, "no zero-advantage filter: every sample trains and counts", script)


def _pickscore(cfg: str) -> list[PeerValue]:
    return [
        _v("reward", {"pickscore": 1.0}, 'reward_fn = {"pickscore": 1.0}', f"{GRPO}::{cfg}"),
        _v("reward.pickscore.scale", 1 / 26, "score / 26", "flow_grpo/pickscore_scorer.py"),
    ]


def _sd35_medium() -> Recipe:
    cfg, script = "pickscore_sd3", "scripts/train_sd3.py"
    g = f"{GRPO}::{cfg}"
    return Recipe("sd35_medium", "Flow-GRPO pickscore_sd3", SOURCES["flow_grpo"], _merge([
        *_flow_grpo_common(cfg, script),
        _v("model.dtype", "float16", 'mixed_precision = "fp16"', BASE),
        _v("train.mixed_precision", "fp16", 'mixed_precision = "fp16" (fp32 LoRA weights, fp16 autocast)', BASE),
        *_lora("sd3", 32, 64, script),
        _v("model.options.height", 512, "resolution = 512", g),
        _v("model.options.width", 512, "resolution = 512", g),
        _v("model.options.max_sequence_length", 128, "compute_text_embeddings(..., max_sequence_length=128)", script),
        _v("model.options.negative_prompt", "", 'compute_text_embeddings([""], ...) (negative)', script),
        _v("sampler.num_steps", 10, "sample.num_steps = 10", g),
        _v("sampler.eval_num_steps", 40, "sample.eval_num_steps = 40", g),
        _v("sampler.noise_level", 0.7, "sample.noise_level = 0.7", BASE),
        _v("sampler.cfg_scale", 4.5, "sample.guidance_scale = 4.5", g),
        _v("sampler.eval_cfg_scale", 4.5, "eval(): guidance_scale=config.sample.guidance_scale", script),
        _v("train.prompts_per_step", 48, "sample.train_batch_size 9 x 32 GPUs x num_batches_per_epoch 4 / 24", g),
        _v("train.generations", 24, "sample.num_image_per_prompt = 24", g),
        _v("train.std_mode", "global", "sample.global_std = True", g),
        _v("train.beta_kl", 0.01, "train.beta = 0.01", g),
        _v("train.minibatches_per_step", 2,
           "num_batches_per_epoch 4 / train.gradient_accumulation_steps (4 // 2): two optimizer steps per epoch", g),
        _v("train.timestep_strategy", "fraction", "num_train_timesteps = int(num_steps * timestep_fraction)", script),
        _v("train.timestep_fraction", 0.99, "train.timestep_fraction = 0.99", g),
        *_ema(g, script, 8),
        *_micro_batch_quirks(script, cfg, per_gpu=9, gpus=32, ema_k=2, refill=True, permuted=True),
        _v("train.cfg_detach_uncond", True, "compute_log_prob: noise_pred_uncond = noise_pred_uncond.detach()", script),
        *_pickscore(cfg),
        _v("eval.every", 60, "eval_freq = 60", g),
    ]), quirks=_FLOW_GRPO_QUIRKS)


GUARD_CFG = "config/grpo_guard.py::pickscore_hps_sd3_ratio_norm"
GUARD_SCRIPT = "scripts/train_sd3_GRPO_Guard.py"
INHERITED = "config/grpo.py::pickscore_sd3 (GRPO-Guard's config derives from it; this value not compared)"


def _sd35_medium_grpo_guard() -> Recipe:
    """GRPO-Guard's SD3.5-Medium PickScore + HPS recipe: sd35_medium's Flow-GRPO values with the settings
    GRPO-Guard's config changes (issue 40 read them in ``zhtmike/flow_grpo@9745241``: clip 4e-6, lr 1e-4, group
    std, KL 0, two optimizer steps per epoch); the values it does not name keep pickscore_sd3's, with
    ``INHERITED`` as their source, and the reward weights are not read (equal weights assumed)."""
    g, s = GUARD_CFG, GUARD_SCRIPT
    base = [PeerValue(v.key, v.value, v.peer, INHERITED if v.source.startswith(f"{GRPO}::") else v.source)
            for v in _sd35_medium().values if not v.key.startswith("reward")]
    return Recipe("sd35_medium_grpo_guard", "GRPO-Guard pickscore_hps_sd3_ratio_norm",
                  f"{SOURCES['flow_grpo']}; zhtmike/flow_grpo@9745241 ({GUARD_CFG.split('::')[0]}, {GUARD_SCRIPT})",
                  _merge([
                      *base,
                      _v("train.algorithm", "grpo_guard", "config.rationorm = True: RatioNorm and the -dt reweight", s),
                      _v("train.guard_bias", "batch", "bias = (...).pow(2).mean(dim=tuple(range(1, log_prob.ndim))) "
                                                      "on a 1-D log_prob: one mean over the per-device batch", s),
                      _v("train.clip_range", 4e-6, "train.clip_range = 4e-6 (2e-6 in the OCR / GenEval configs)", g),
                      _v("train.lr", 1e-4, "train.learning_rate = 1e-4", g),
                      _v("train.std_mode", "group", "sample.global_std = False", g),
                      _v("train.beta_kl", 0.0, "train.beta = 0", g),
                      _v("train.minibatches_per_step", 2, "two optimizer steps per epoch", g),
                      _v("reward", {"pickscore": 1.0, "hpsv2": 1.0},
                         "reward_fn: PickScore and HPS (the config's name; the weights not read: equal assumed)", g),
                      _v("reward.pickscore.scale", 1 / 26, "score / 26", "flow_grpo/pickscore_scorer.py"),
                  ]), quirks=_FLOW_GRPO_QUIRKS)


_FLOW_GRPO_QUIRKS = (
    "Micro-batch options (train.micro_batch, ema_update, zero_adv_refill, minibatch_split): Flow-GRPO rounds and "
    "permutes each GPU's share of the samples with its global torch RNG; here the whole step's, seeded by (run "
    "seed, step[, inner epoch]), so the same options do not draw Flow-GRPO's samples.",
    "Noise: flow_grpo seeds per device and batch; here per (seed, step, prompt, generation), so the same seed "
    "does not draw flow_grpo's samples.",
)


def _flux1_dev() -> Recipe:
    cfg, script = "pickscore_flux", "scripts/train_flux.py"
    g = f"{GRPO}::{cfg}"
    return Recipe("flux1_dev", "Flow-GRPO pickscore_flux", SOURCES["flow_grpo"], _merge([
        *_flow_grpo_common(cfg, script),
        _v("model.dtype", "bfloat16", 'mixed_precision = "bf16"', g),
        _v("train.mixed_precision", "bf16", 'mixed_precision = "bf16"', g),
        *_lora("flux", 64, 128, script),
        _v("model.options.height", 512, "resolution = 512", g),
        _v("model.options.width", 512, "resolution = 512", g),
        _v("model.options.max_sequence_length", 128, "compute_text_embeddings(..., max_sequence_length=128)", script),
        _v("sampler.num_steps", 6, "sample.num_steps = 6", g),
        _v("sampler.eval_num_steps", 28, "sample.eval_num_steps = 28", g),
        _v("sampler.noise_level", 0.9, "sample.noise_level = 0.9", g),
        _v("sampler.cfg_scale", 3.5, "sample.guidance_scale = 3.5 (the guidance embedding, sampling and training)", g),
        _v("sampler.eval_cfg_scale", 3.5, "eval(): guidance_scale=config.sample.guidance_scale", script),
        _v("train.prompts_per_step", 48, "sample.train_batch_size 3 x 32 GPUs x num_batches_per_epoch 12 / 24", g),
        _v("train.generations", 24, "sample.num_image_per_prompt = 24", g),
        _v("train.std_mode", "global", "sample.global_std = True", g),
        _v("train.beta_kl", 0.0, "train.beta = 0", g),
        _v("train.minibatches_per_step", 2,
           "num_batches_per_epoch 12 / train.gradient_accumulation_steps (12 // 2): two optimizer steps per epoch", g),
        _v("train.timestep_strategy", "fraction", "num_train_timesteps = int(num_steps * timestep_fraction)", script),
        _v("train.timestep_fraction", 0.99, "train.timestep_fraction = 0.99", g),
        *_ema(g, script, 8),
        _no_filter(script),
        *_micro_batch_quirks(script, cfg, per_gpu=3, gpus=32, ema_k=6, refill=False, permuted=True),
        *_pickscore(cfg),
        _v("eval.every", 30, "eval_freq = 30", g),
    ]), quirks=_FLOW_GRPO_QUIRKS)


def _wan21_14b() -> Recipe:
    cfg, script = "general_ocr_wan2_1", "scripts/train_wan2_1.py"
    g = f"{GRPO}::{cfg}"
    return Recipe("wan21_14b", "Flow-GRPO general_ocr_wan2_1", SOURCES["flow_grpo"], _merge([
        *_flow_grpo_common(cfg, script),
        _v("model.dtype", "bfloat16", 'mixed_precision = "bf16"', g),
        _v("train.mixed_precision", "bf16", 'mixed_precision = "bf16"', g),
        *_lora("wan", 32, 64, script),
        _v("model.options.height", 240, "height = 240", g),
        _v("model.options.width", 416, "width = 416", g),
        _v("model.options.frames", 33, "frames = 33", g),
        _v("model.options.max_sequence_length", 512, "compute_text_embeddings(..., max_sequence_length=512)", script),
        _v("model.options.negative_prompt", "", 'compute_text_embeddings([""], ...) (negative)', script),
        _v("sampler.num_steps", 20, "sample.num_steps = 20", g),
        _v("sampler.eval_num_steps", 50, "sample.eval_num_steps = 50", g),
        _v("sampler.noise_level", 0.7, "sample.noise_level = 0.7", BASE),
        _v("sampler.cfg_scale", 4.5, "sample.guidance_scale = 4.5", g),
        _v("sampler.eval_cfg_scale", 4.5, "eval(): guidance_scale=config.sample.guidance_scale", script),
        _v("train.prompts_per_step", 32,
           "sample.train_batch_size 8 x GPUs x num_batches_per_epoch 2 / 4 = 4 per GPU (the config names no GPU "
           "count; one node of 8)", g),
        _v("train.generations", 4, "sample.num_image_per_prompt = 4", g),
        _v("train.lr", 1e-4, "train.learning_rate = 1e-4", g),
        _v("train.clip_range", 1e-3, "train.clip_range = 1e-3", g),
        _v("train.std_mode", "group", "sample.global_std = False", g),
        _v("train.beta_kl", 0.004, "train.beta = 0.004", g),
        _v("train.kl_form", "exact", "kl = mean((mu - mu_ref)^2) / (2 (std_dev_t sqrt(-dt))^2)", script),
        _v("train.minibatches_per_step", 2,
           "num_batches_per_epoch 2 / train.gradient_accumulation_steps 1: two optimizer steps per epoch", g),
        _v("train.timestep_strategy", "fraction", "num_train_timesteps = int(num_steps * timestep_fraction)", script),
        _v("train.timestep_fraction", 0.99, "train.timestep_fraction = 0.99", g),
        *_ema(g, script, 8),
        *_micro_batch_quirks(script, cfg, per_gpu=8, gpus=8, ema_k=1, refill=True, permuted=True,
                             gpu_note=" (one node; the config names no count)"),
        _v("train.cfg_detach_uncond", False, "compute_log_prob: both CFG branches keep their gradient", script),
        _v("reward", {"ocr": 1.0}, 'reward_fn = {"video_ocr": 1.0} (video OCR: the built-in ocr on frames)', g),
        _v("reward.ocr.frame_stride", 4, "OcrScorer_video_or_image: every 4th frame", "flow_grpo/ocr.py"),
        _v("eval.every", 30, "eval_freq = 30", g),
    ]), quirks=(*_FLOW_GRPO_QUIRKS,
                "Zero-advantage filter: where every sample of a GPU has advantage 0, train_wan2_1.py adds 1e-6 to "
                "its advantages (none of them is then filtered); here such samples stay out.",
                "Model: general_ocr_wan2_1 loads Wan2.1-T2V-1.3B (the 14B path is commented out above it); this "
                "preset trains 14B with the same settings."))


def _qwen_image() -> Recipe:
    cfg, script = "pickscore_qwenimage", "scripts/train_qwenimage.py"
    g = f"{GRPO}::{cfg}"
    pipe = "flow_grpo/diffusers_patch/qwenimage_pipeline_with_logprob.py"
    return Recipe("qwen_image", "Flow-GRPO pickscore_qwenimage",
                  f"{SOURCES['flow_grpo']}; {SOURCES['flow_grpo_qwen']}", _merge([
        *_flow_grpo_common(cfg, script),
        _v("model.dtype", "bfloat16", 'mixed_precision = "bf16"', g),
        _v("train.mixed_precision", "bf16", 'mixed_precision = "bf16"', g),
        *_lora("qwen_image", 64, 128, script),
        _v("model.options.height", 512, "resolution = 512", g),
        _v("model.options.width", 512, "resolution = 512", g),
        _v("model.options.max_sequence_length", 512, "pipeline_with_logprob(max_sequence_length=512)", pipe),
        _v("model.options.negative_prompt", " ", 'negative_prompt=[" "] * len(prompts)', script),
        _v("sampler.num_steps", 10, "sample.num_steps = 10", g),
        _v("sampler.eval_num_steps", 50, "sample.eval_num_steps = 50", g),
        _v("sampler.noise_level", 1.2, "sample.noise_level = 1.2", g),
        _v("sampler.cfg_scale", 4.0, "sample.guidance_scale = 4 (true CFG, norm-rescaled)", g),
        _v("sampler.eval_cfg_scale", 4.0, "eval(): true_cfg_scale=config.sample.guidance_scale", script),
        _v("train.prompts_per_step", 32, "sample.train_batch_size 4 x 32 GPUs x num_batches_per_epoch 4 / 16", g),
        _v("train.generations", 16, "sample.num_image_per_prompt = 16", g),
        _v("train.std_mode", "global", "sample.global_std = True", g),
        _v("train.beta_kl", 0.0, "train.beta = 0", g),
        _v("train.minibatches_per_step", 2,
           "num_batches_per_epoch 4 / train.gradient_accumulation_steps (4 // 2): two optimizer steps per epoch", g),
        _v("train.timestep_strategy", "window", "SDE only in the window; num_train_timesteps = sde_window_size",
           script),
        _v("train.window_size", 2, "sample.sde_window_size = 2", g),
        _v("train.window_range", (0, 5), "sample.sde_window_range = (0, num_steps // 2)", g),
        _v("train.ema_decay", None, "train.ema = False", g),
        _no_filter(script),
        *_micro_batch_quirks(script, cfg, per_gpu=4, gpus=32, ema_k=None, refill=False, permuted=False),
        _v("train.cfg_detach_uncond", False, "compute_log_prob: both CFG branches in one forward, with gradient",
           script),
        _v("train.activation_checkpointing", True, "activation_checkpointing = True", g),
        *_pickscore(cfg),
        _v("eval.every", 30, "eval_freq = 30", g),
    ]), quirks=(*_FLOW_GRPO_QUIRKS,
                "SDE window: the pipeline calls random.seed(process_index) before drawing the window start and the "
                "script passes no process_index, so every epoch draws randint(0, 3) after seed(0) = 3: the window is "
                "always steps 3-4. Here the start is drawn per step inside window_range (window_range: [3, 5] "
                "gives the fixed window)."))


def _hunyuan_video() -> Recipe:
    sh, py = "scripts/finetune/finetune_hunyuan_grpo.sh", "fastvideo/train_grpo_hunyuan.py"
    return Recipe("hunyuan_video", "DanceGRPO HunyuanVideo (finetune_hunyuan_grpo.sh)", SOURCES["dancegrpo"], (
        _v("seed", 42, "--seed 42", sh),
        _v("steps", 202, "--max_train_steps 202", sh),
        _v("model.dtype", "bfloat16", "--mixed_precision bf16", sh),
        _v("train.mixed_precision", "bf16", "--mixed_precision bf16 (--master_weight_type fp32, the default)", sh),
        _v("model.lora.enabled", False, "full fine-tuning (no LoRA in train_grpo_hunyuan.py)", py),
        _v("model.options.height", 480, "--h 480", sh),
        _v("model.options.width", 480, "--w 480", sh),
        _v("model.options.frames", 53, "--t 53", sh),
        _v("sampler.num_steps", 16, "--sampling_steps 16", sh),
        _v("sampler.kind", "dance", "flux_step: std = eta sqrt(sigma - sigma') with the score correction", py),
        _v("sampler.noise_level", 0.25, "--eta 0.25", sh),
        _v("sampler.static_shift", 5.0, "--shift 5: sd3_time_shift(shift, linspace(1, 0, T + 1))", sh),
        _v("sampler.integer_timesteps", True, "timestep = int(sigma * 1000)", py),
        _v("sampler.same_latent", True, "--use_same_noise", sh),
        _v("sampler.cfg_scale", 6.018, "guidance=torch.tensor([6018.0]) (embedded guidance, 1000 w)", py),
        _v("train.prompts_per_step", 32, "--train_batch_size 1 x 32 GPUs (--nnodes 4 --nproc_per_node 8)", sh),
        _v("train.generations", 24, "--num_generations 24", sh),
        _v("train.best_of_n", 8, "--bestofn 8", sh),
        *_fastvideo_grpo(sh, py, [_v("train.clip_range", 1e-4, "clip_range = 1e-4 (train_one_step)", py),
                                  _v("train.adv_clip_max", 5.0, "adv_clip_max = 5.0 (train_one_step)", py)]),
        _v("train.filter_zero_advantage", False, "no filter: every kept sample counts in the loss mean", py),
        _v("train.beta_kl", 0.0, "no KL term in the loss", py),
        _v("train.minibatches_per_step", 2,
           "8 kept samples per rank / --gradient_accumulation_steps 4: two optimizer steps per step", sh),
        _v("train.inner_epochs", 1, "one pass over the samples", py),
        _v("train.timestep_strategy", "fraction", "train_timesteps = int(len(timesteps) * timestep_fraction)", py),
        _v("train.timestep_fraction", 0.6, "--timestep_fraction 0.6", sh),
        _v("train.ema_decay", None, "--ema_decay 0.999 is parsed but no EMA is kept", py),
        _v("train.cfg_in_training", True, "grpo_one_step: the same embedded guidance 6018", py),
        _v("reward", "VideoAlign VQ (weight 1.0; MQ 0.0)", "--use_videoalign --vq_coef 1.0 --mq_coef 0.0", sh),
    ), quirks=(
        "Trained timesteps: DanceGRPO trains a random per-sample subset of int((T - 1) f) = 9 of the first T - 1 "
        "= 15 steps; here the first int(T f) = 9 steps, the same count.",
        "Minibatches: DanceGRPO's optimizer step covers 4 kept samples of each rank's group (one group per "
        "rank); here a minibatch is whole groups (M = 2: 16 of the 32 groups each).",
        "Guidance: DanceGRPO passes 6018.0 to the embedding, i.e. w = 6.018 in the pipeline's 1000 w units.",
    ))


from .recipe_algorithms import algorithm_recipes  # noqa: E402 (the train.algorithm presets: NFT, MixGRPO)

RECIPES: dict[str, Recipe] = {r.preset: r for r in (_sd35_medium(), _flux1_dev(), _wan21_14b(), _hunyuan_video(),
                                                    _qwen_image(), _sd35_medium_grpo_guard(), *algorithm_recipes())}
