"""Simulating a DigenRL run's own plan: ``digenrl simulate --config FILE [--set key=value ...]`` with a measured
``--profile`` or on a named GPU ``--testbed`` (roofline cost model).

Both paths build exactly the ``StepPlan`` the Ray runtime would execute for each mode, and decide TAG with
the config's ``runtime.tag_policy`` / ``runtime.bts`` as the runtime does
(``digenrl.control.run_plan.plan_run``: pools, P x G, fragment size, trained timesteps, chunk shape, stale cap).
``colocated`` runs on all ``runtime.generators + runtime.trainers`` workers. The step time is makespan / steps,
as in the roofline path.

Testbed path: the config is mapped onto the roofline's inputs (``config_model``, ``config_workload``):

* family: ``model.kind`` -> the sim's model preset (``SIM_MODEL_OF_KIND``), text tokens from
  ``model.options.max_sequence_length`` (SD3: 77 CLIP tokens + the T5 length, as ``train.memory`` counts them);
* workload: P = ``train.prompts_per_step``, G = ``train.generations``, T = ``sampler.num_steps``, S from
  ``plan_run`` (the trained share is S / T), width / height / frames from ``model.options``; the algorithm from
  ``train.algorithm`` (``sim.algorithms``: MixGRPO's window = S, MixGRPO-Flash's ``sampler.post_compress_ratio``,
  whose shorter sampling the priced plan takes as its denoising steps; DiffusionNFT's K = S, CFG-free training);
* training: LoRA rank from ``model.lora``, FSDP from ``train.sharding``, recomputation from
  ``train.activation_checkpointing``, publish path from ``runtime.publish``.

Memory: the trainer and generator plans of ``digenrl.train.memory`` (the estimate ``digenrl train`` refuses a
config with) decide "fits" with the testbed GPU's memory as ``train.memory_gb`` (per-rank, in the units of
that key); ``train.chunk_cells: auto`` is resolved against the same capacity. The roofline's own check
(``InfeasibleError``: e.g. a colocated rank that cannot generate next to its training state) comes second.
``--gpus N`` keeps the config's generator : trainer ratio: N_t = max(1, round(N x t / (g + t))), N_g = N - N_t.
A colocated config's W workers are split W // 2 generators + the rest trainers for the disaggregated modes
(``digenrl plan`` searches the split instead).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..control.profile import ProfileCost
from ..control.timeline import RunResult
from .executor import simulate
from .algorithms import Algorithm
from .presets import MODELS, ModelPreset, Testbed, Training, Workload

# SD3.5-Medium (not among the roofline presets of the paper's testbeds): MM-DiT, joint text (CLIP 77 + T5),
# true CFG (2 forwards), 16-channel SD3 VAE (the FLUX/SD3 AutoencoderKL FLOPs per pixel), PickScore reward.
SD35_MEDIUM = ModelPreset("SD3.5-Medium", "sd35-medium", 77 + 256, True, 2, False, vae_flop_per_px=9.59e6,
                          reward_tflop=0.38,
                          source="stabilityai/stable-diffusion-3.5-medium model card and config.json")
SIM_MODEL_OF_KIND = {"flux": MODELS["flux"], "wan": MODELS["wan"], "hunyuan_video": MODELS["hunyuan"],
                     "qwen_image": MODELS["qwen-image"], "sd3": SD35_MEDIUM}


class ConfigSimError(ValueError):
    """A config the testbed path cannot price (unknown family, bad --gpus, memory shortfall); names the key."""


@dataclass
class ConfigRun:
    """One simulated mode of a config; the fields ``sim.cli.rows_of`` reads, like ``planner.ModeRun``."""

    mode: str
    plan: object
    result: RunResult
    note: str = ""
    ranks: int | None = None  # trainer ranks (a sharded pool is one scheduler trainer of this many ranks)

    @property
    def n_gen(self) -> int:
        return len(self.plan.generators)

    @property
    def n_train(self) -> int:
        return self.ranks if self.ranks is not None else len(self.plan.trainers)


def _mode_overrides(cfg, mode: str) -> list[str]:
    if mode == "colocated":
        workers = cfg.runtime.generators + cfg.runtime.trainers
        return ["runtime.mode=colocated", f"runtime.trainers={workers}", "runtime.generators=1"]
    return [f"runtime.mode={mode}"]


def run_config_modes(config: str | None, sets: list[str], cost: ProfileCost, modes: list[str], *,
                     jitter: float = 0.0, seed: int = 0, record_mode: str | None = None,
                     measured_trainers: int | None = None) -> dict[str, ConfigRun]:
    """Every requested mode plus ``naive`` and ``colocated`` (the speedup baselines). Raises ConfigError, and
    ConfigSimError for a requested disaggregated mode whose trainer ranks differ from the ``measured_trainers``
    the profile says it was measured with (its all-reduce is unknown there, as ``digenrl plan`` refuses them; one
    rank: all-reduce 0). The baselines, colocated runs and profiles that do not name their pools are priced
    as profiled, and the row's note says so."""
    from ..config import load_config
    from ..control.run_plan import plan_run
    from .plan_search import profile_costs

    base = load_config(config, sets)
    cost_of = profile_costs(cost, measured_trainers)
    runs = {}
    for m in dict.fromkeys(list(modes) + ["naive", "colocated"]):
        cfg = load_config(config, sets + _mode_overrides(base, m))
        run = plan_run(cfg)
        ranks = len(run.trainer_ids)
        c, note = cost_of(len(run.generator_ids), ranks), ""
        if isinstance(c, str):
            if m in modes and m != "colocated" and measured_trainers is not None:
                raise ConfigSimError(f"--profile: {c}")
            c = cost
            note = (f"all-reduce at {ranks} ranks priced as profiled at {measured_trainers}" if measured_trainers
                    else f"profile without pool sizes: all-reduce at {ranks} ranks as profiled")
        runs[m] = ConfigRun(m, run.plan, simulate(run.plan, c, jitter=jitter, seed=seed, bts=cfg.runtime.bts_config(),
                                                  record=(m == record_mode)), note, ranks)
    return runs


# ---- the testbed path ----------------------------------------------------------------------------------------

def config_model(cfg) -> ModelPreset:
    """The sim's model preset of ``model.kind`` with the config's text length."""
    m = SIM_MODEL_OF_KIND.get(cfg.model.kind)
    if m is None:
        raise ConfigSimError(f"model.kind: {cfg.model.kind!r} has no roofline preset (known: "
                             f"{', '.join(SIM_MODEL_OF_KIND)}); price it with --profile instead")
    txt = cfg.model.options.get("max_sequence_length")
    if txt is not None:
        m = replace(m, text_tokens=int(txt) + (77 if cfg.model.kind == "sd3" else 0))
    return m


def config_training(cfg) -> Training:
    lora = cfg.model.lora
    return Training(lora_rank=lora.rank if lora.enabled else 0, sharded=cfg.train.sharding == "fsdp",
                    publish=cfg.runtime.publish, recompute=cfg.train.activation_checkpointing,
                    tag_copy=cfg.runtime.tag_inference_copy,
                    shard_groups=cfg.train.shard_groups if cfg.train.sharding == "fsdp" else 1)


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
    video = config_model(cfg).video
    return Workload(t.prompts_per_step, t.generations, int(o.get("width", 512)), int(o.get("height", 512)),
                    int(o.get("frames", 1)) if video else 1, sampling_steps=T, timestep_fraction=trained / T,
                    training=config_training(cfg), algorithm=config_algorithm(cfg, trained),
                    trained_share=trained_share(cfg))


def trained_share(cfg) -> float:
    """The share of a planned chunk's cells the trainers run: best_of_n / G, times 1 / M for sample or generation
    minibatches (``Workload.trained_share``)."""
    t = cfg.train
    share = t.best_of_n / t.generations if t.best_of_n is not None else 1.0
    return share / t.minibatches_per_step if t.minibatch_split in ("samples", "generations") else share


def pools_for(cfg, gpus: int | None) -> tuple[int, int]:
    """(N_g, N_t): the config's pools, or ``gpus`` GPUs in the config's ratio (module docstring)."""
    g, t = cfg.runtime.generators, cfg.runtime.trainers
    if gpus is not None and gpus < 2:
        raise ConfigSimError(f"--gpus: need at least 2 GPUs for two pools (got {gpus})")
    if cfg.runtime.mode == "colocated":
        return 0, (t if gpus is None else gpus)
    if gpus is None:
        return g, t
    nt = max(1, min(gpus - 1, round(gpus * t / (g + t))))
    return gpus - nt, nt


def fit_to_testbed(cfg, testbed: Testbed, n_gen: int, n_train: int, colocated: bool):
    """``cfg`` planned for ``testbed``'s GPUs (``train.memory_gb`` = the GPU's memory, ``chunk_cells: auto``
    resolved); raises ``ConfigSimError`` with the memory plan's per-rank shortfall when it does not fit."""
    from ..control.run_plan import timestep_plan
    from ..train.memory import MemoryPlanError, check_config, check_generators, resolve_chunk_cells

    train_gpu = testbed.gpu2 or testbed.gpu
    gen_gpu = train_gpu if colocated else testbed.gpu
    t = cfg.train.model_copy(update={"memory_gb": train_gpu.memory_gb})
    cfg = cfg.model_copy(update={"train": t})
    try:
        check_config(cfg, train_gpu.memory_gb)
        if not colocated:
            check_generators(cfg, gen_gpu.memory_gb)
        cfg = resolve_chunk_cells(cfg, len(timestep_plan(cfg, 0).trained))
    except MemoryPlanError as e:
        where = f"{n_train} trainer ranks" if not colocated else f"{n_train} colocated ranks"
        raise ConfigSimError(f"--testbed: does not fit testbed {testbed.name} ({train_gpu.name}, {where}): "
                             f"{e}") from None
    return cfg


def testbed_cost(cfg, plan, testbed: Testbed, ranks: int | None = None):
    """The roofline cost model of ``plan`` (its pools; ``ranks`` trainer ranks) on ``testbed``; raises
    ConfigSimError if infeasible."""
    from .roofline import InfeasibleError, RooflineCost

    colocated = not plan.generators
    try:
        return RooflineCost(config_model(cfg), config_workload(cfg, plan.trained_timesteps), testbed,
                            len(plan.generators), ranks or len(plan.trainers), colocated)
    except InfeasibleError as e:
        raise ConfigSimError(f"--testbed: does not fit testbed {testbed.name}: {e}") from None


def pool_overrides(mode: str, n_gen: int, n_train: int) -> list[str]:
    if mode == "colocated":
        return ["runtime.mode=colocated", f"runtime.trainers={n_gen + n_train}", "runtime.generators=1"]
    return [f"runtime.mode={mode}", f"runtime.generators={n_gen}", f"runtime.trainers={n_train}"]


def price_on_testbed(config: str | None, sets: list[str], testbed: Testbed, modes: list[str], *,
                     gpus: int | None = None, jitter: float = 0.0, seed: int = 0,
                     record_mode: str | None = None) -> dict[str, ConfigRun]:
    """Every requested mode plus the baselines, on ``testbed`` with the config's pools (or ``gpus``).
    Raises ConfigError / ConfigSimError (exit 2 in the CLI)."""
    from ..config import load_config
    from .plan_search import plan_for_pricing

    base = load_config(config, sets)
    config_model(base)  # refuses an unknown family before anything else
    n_gen, n_train = pools_for(base, gpus)
    if n_gen + n_train > testbed.total:
        raise ConfigSimError(f"--gpus: {n_gen + n_train} GPUs ({n_gen} generators + {n_train} trainers) exceed "
                             f"testbed {testbed.name} ({testbed.total} GPUs)")
    if n_gen == 0:  # a colocated config: the disaggregated modes get half of its workers each
        if n_train < 2:
            raise ConfigSimError(f"runtime.trainers: {n_train} colocated worker cannot be split into two pools")
        n_gen, n_train = n_train // 2, n_train - n_train // 2
    runs = {}
    for m in dict.fromkeys(list(modes) + ["naive", "colocated"]):
        cfg = load_config(config, sets + pool_overrides(m, n_gen, n_train))
        cfg = fit_to_testbed(cfg, testbed, n_gen, n_train, m == "colocated")
        plan, ranks, note = plan_for_pricing(cfg)  # sim.plan_search (``digenrl plan`` prices the same way)
        cost = testbed_cost(cfg, plan, testbed, ranks)
        plan = replace(plan, sampling_steps=cost.workload.denoise_steps)  # MixGRPO-Flash samples fewer steps
        runs[m] = ConfigRun(m, plan, simulate(plan, cost, jitter=jitter, seed=seed, bts=cfg.runtime.bts_config(),
                                              record=(m == record_mode)), note, ranks)
    return runs
