"""A config's memory plan (``train.memory``'s formulas applied to a ``Config``): its ``PlanInputs``, the
refusals before anything starts (``check_config`` for the trainer ranks, ``check_generators`` for the generator
pool, each naming the keys that would make it fit), the batch a trainer rank samples at once (evals, TAG,
colocated: ``trainer_generation_batch``) and ``train.chunk_cells: auto`` resolved to a chunk shape."""

from __future__ import annotations

from dataclasses import replace

from digenrl.control.run_plan import grad_sum_fp64
from digenrl.models.specs import SEQUENCE_PARALLEL_FAMILIES
from digenrl.schedule.layout import choose_chunk_shape, rank_share
from digenrl.schedule.plan import Mode

from .memory import (FAMILIES, GiB, MemoryPlan, MemoryPlanError, PlanInputs, generator_bytes, plan_memory,
                     samples_that_fit)

SAMPLE_BATCH = 64  # the most samples one sampling batch holds (``step_math.generate``); VAE decoding is unpriced


def inputs_from_config(cfg) -> PlanInputs | None:
    """``PlanInputs`` of a ``Config`` (None for models without a plan, e.g. the built-in tiny DiT); sizes and the
    text length default to the family adapter's (``models.specs``)."""
    m, t, s = cfg.model, cfg.train, cfg.sampler
    f = FAMILIES.get(m.kind)
    if f is None:
        return None
    o, sp = m.options, f.spec
    h, w, frames = sp.default_size
    cfg_forwards = 2 if (t.cfg_in_training and s.cfg_scale != 1.0 and not sp.guidance_distilled) else 1
    text_loaded = o.get("load_text_encoders", "auto") is True or not m.prompt_cache_dir
    return PlanInputs(
        family=m.kind, height=int(o.get("height", h)), width=int(o.get("width", w)),
        frames=int(o.get("frames", frames)) if sp.video else 1, text_tokens=sp.text_tokens(o.get("max_sequence_length")),
        lora_rank=m.lora.rank if m.lora.enabled else None, model_dtype=m.dtype,
        mixed_precision=t.mixed_precision, activation_checkpointing=t.activation_checkpointing,
        sharding=t.sharding, cpu_offload=t.cpu_offload, ranks=shard_ranks(cfg), beta_kl=t.beta_kl, ema=t.ema_decay is not None,
        forwards_per_cell=cfg_forwards, text_encoders=text_loaded, sequence_parallel=t.sequence_parallel.degree,
        grad_sums=grad_sum_fp64(cfg), param_copies=param_copies(t), inference_copy=inference_copy(cfg),
    )  # fmt: skip


def param_copies(t) -> int:
    """Trainable-sized shadows a trainer rank keeps (``train.ema.ParamCopy``, the EMA apart): DiffusionNFT's soft
    old policy (``train.nft_old.attach``) and the step-start snapshot of ``recompute`` with several rounds a step
    (``train.old_logprob.attach``)."""
    nft = t.algorithm == "nft" and t.nft_old_policy == "soft"
    start = t.old_logprob == "recompute" and t.minibatches_per_step * t.inner_epochs > 1
    return int(nft) + int(start)


def inference_copy(cfg) -> bool:
    """A rank of a shard group that generates (TAG, or colocated) builds an unsharded policy to do it
    (``tuning.tag_inference_copy``; ``runtime.trainer.TrainerWorker._inference_copy``) and keeps it."""
    mode = Mode(cfg.runtime.mode)
    return (cfg.tuning.tag_inference_copy and shard_ranks(cfg) > 1
            and (mode.tag or not mode.disaggregated))


def chunk_cells(cfg) -> int:
    """Cells per rank of the chunk the config asks for: ``chunk_generations * chunk_timesteps``, split over the
    lanes under FSDP (a sharded pool trains each chunk together, ``train.sharding.rank_cells``; the ranks of a
    sequence-parallel lane all train the lane's cells, each on its share of the tokens)."""
    cells = cfg.train.chunk_generations * cfg.train.chunk_timesteps
    return -(-cells // lanes(cfg))


def lanes(cfg) -> int:
    """Data-parallel lanes of a scheduler trainer: a shard group's ranks / train.sequence_parallel under FSDP, else 1."""
    return shard_ranks(cfg) // cfg.train.sequence_parallel.degree if cfg.train.sharding == "fsdp" else 1


def shard_ranks(cfg) -> int:
    """Ranks the trainable state is sharded over: runtime.trainers / train.shard_groups under FSDP, else 1."""
    return cfg.runtime.trainers // cfg.train.shard_groups if cfg.train.sharding == "fsdp" else 1


def auto_chunk_shape(max_cells: int, generations: int, trained: int) -> tuple[int, int]:
    """(chunk_generations, chunk_timesteps) with the most cells <= ``max_cells``: whole timesteps of the group
    first (cg = G), then as many timesteps as fit; below G cells, the largest divisor-free cg <= max_cells."""
    if max_cells < 1:
        raise ValueError("not even one training cell fits")
    if max_cells >= generations:
        return generations, max(1, min(trained, max_cells // generations))
    return max_cells, 1


def check_config(cfg) -> MemoryPlan | None:
    """Refuse (``MemoryPlanError``) a config whose trainer plan exceeds ``train.memory_gb`` per rank (no check
    when it is not set). Returns the plan (None: no plan for this model)."""
    p = inputs_from_config(cfg)
    cap = cfg.train.memory_gb
    if p is None or cap is None:
        return None
    plan = plan_memory(p)
    cells = 1 if cfg.train.chunk_cells == "auto" else chunk_cells(cfg)
    if plan.total(cells) <= cap * GiB:
        return plan
    fits, k, fsdp = plan.max_cells(cap * GiB), cfg.train.shard_groups, p.sharding == "fsdp"
    hints = [hint for ok, hint in (
        (fits >= 1, f"train.chunk_cells=auto (or chunk_generations x chunk_timesteps <= {fits} cells)"),
        (not p.activation_checkpointing, "train.activation_checkpointing=true"),
        (p.family in SEQUENCE_PARALLEL_FAMILIES, f"train.sequence_parallel (now {p.sequence_parallel}: split each "
         f"sample's {FAMILIES[p.family].tokens(p.height, p.width, p.frames)} latent tokens over more ranks)"),
        (p.sharding == "none", "train.sharding=fsdp with more runtime.trainers"),
        (fsdp, f"more runtime.trainers (now {p.ranks})" if k == 1 else
         f"fewer train.shard_groups or more runtime.trainers (now {k} groups of {p.ranks} ranks)"),
        (fsdp and not p.cpu_offload, "train.cpu_offload=true"),
        (p.lora_rank is None, "model.lora.enabled=true"),
        (p.mixed_precision == "none" and p.model_dtype == "float32", "train.mixed_precision=bf16"),
        (p.text_encoders, "model.prompt_cache_dir (no text encoders on the trainer)"),
        (p.inference_copy, "tuning.tag_inference_copy=false (no unsharded copy beside the shards)")) if ok]
    raise MemoryPlanError(
        f"memory plan: {FAMILIES[p.family].spec.name} training needs {plan.total(cells) / GiB:.1f} GiB per trainer "
        f"rank but train.memory_gb={cap:g} ({plan.table(cells)}); change: " + "; ".join(hints)
    )


def _sampling(cfg, p, sequence_parallel: int, evals: bool = False):
    """``p`` as a sampling forward sees it: two forwards per sample under CFG (``sampler.cfg_scale``, and with
    ``evals`` ``sampler.eval_cfg_scale``; not for guidance-distilled families), each sample's sequence split over
    ``sequence_parallel`` ranks."""
    s = cfg.sampler
    scales = {s.cfg_scale} | ({s.eval_cfg_scale} if evals and s.eval_cfg_scale is not None else set())
    fwd = 2 if (scales != {1.0} and not FAMILIES[p.family].spec.guidance_distilled) else 1
    return replace(p, forwards_per_cell=fwd, sequence_parallel=sequence_parallel)


def generator_items(cfg, p) -> dict[str, int]:
    """A generator's bytes by item (``memory.generator_bytes``) for ``cfg`` (memory inputs ``p``: ``inputs_from_config``):
    fragments of ``cfg.fragment_generations()`` (``_sampling``: CFG, the sequence split over
    ``runtime.generator_sequence_parallel`` ranks)."""
    p = _sampling(cfg, p, cfg.runtime.generator_sequence_parallel.degree)
    return generator_bytes(p, cfg.fragment_generations())


def trainer_generation_batch(cfg) -> int | None:
    """The most samples a trainer rank draws in one batch: its evals (every mode, between steps), a ``colocated``
    worker's share of the step (``StepPlan.packed``, at the step's start) and TAG gangs (mid-step):
    ``SAMPLE_BATCH`` or, if fewer, the largest n with

        state + n x a_gen <= train.memory_gb,

    state = ``MemoryPlan.sampling_state`` of the rank's plan (mid-step in the TAG modes, whose gangs sample beside
    the step's gradients; ``sim.memory`` prices a colocated rank with it too); a_gen = one sample's sampling
    activations (``generator_bytes``' per-sample term: ``_sampling`` with the eval's guidance too and the lane's
    ``train.sequence_parallel`` split). None without a
    plan or ``train.memory_gb`` (no bound); ``MemoryPlanError`` (naming the keys) when not even one fits."""
    p = inputs_from_config(cfg)
    mode, cap = Mode(cfg.runtime.mode), cfg.train.memory_gb
    if p is None or cap is None:
        return None
    state = plan_memory(p).sampling_state(mid_step=mode.tag)
    per = generator_bytes(_sampling(cfg, p, p.sequence_parallel, evals=True), 1)["activations"]
    n = samples_that_fit(cap * GiB, state, per)
    if n < 1:
        what = "its evals" + (", TAG gangs" if mode.tag else "") + (", its share of each step" if
                                                                     not mode.disaggregated else "")
        raise MemoryPlanError(
            f"memory plan: a {FAMILIES[p.family].spec.name} trainer rank samples ({what}) beside {state / GiB:.1f} "
            f"GiB of its state and needs {per / GiB:.2f} GiB per sample, more than train.memory_gb={cap:g}; "
            "change: " + "; ".join(
                h for ok, h in ((mode.tag, "runtime.mode without TAG (gap or gap_tsp: trainers do not generate)"),
                                (not p.cpu_offload and p.sharding == "fsdp", "train.cpu_offload=true"),
                                (p.inference_copy, "tuning.tag_inference_copy=false"),
                                (p.family in SEQUENCE_PARALLEL_FAMILIES, "train.sequence_parallel"),
                                (p.lora_rank is None, "model.lora.enabled=true")) if ok))
    return min(n, SAMPLE_BATCH)


def sampling_batch(cfg) -> int | None:
    """The most samples ``digenrl eval`` / ``digenrl sample`` draw in one batch: ``SAMPLE_BATCH`` or, if fewer, the
    largest n with sum(``generator_bytes``(p, n)) <= ``train.memory_gb``: the process holds the policy to sample
    and no training state, a generator's items (``_sampling`` with the eval's guidance too, each sample whole).
    None without a plan or ``train.memory_gb`` (no bound); ``MemoryPlanError`` (naming the keys) when not even
    one fits."""
    p = inputs_from_config(cfg)
    cap = cfg.train.memory_gb
    if p is None or cap is None:
        return None
    q = _sampling(cfg, p, 1, evals=True)
    fixed, per = sum(generator_bytes(q, 0).values()), generator_bytes(q, 1)["activations"]
    n = samples_that_fit(cap * GiB, fixed, per)
    if n < 1:
        sizes = "height / width" + (" / frames" if FAMILIES[p.family].spec.video else "")
        hints = [h for ok, h in ((fixed < cap * GiB, f"smaller model.options {sizes}"),
                                 (p.model_dtype == "float32", "model.dtype=bfloat16"),
                                 (p.text_encoders, "model.prompt_cache_dir (no text encoders)")) if ok]
        raise MemoryPlanError(
            f"memory plan: sampling {FAMILIES[p.family].spec.name} needs {(fixed + per) / GiB:.1f} GiB for one "
            f"sample ({fixed / GiB:.1f} of it weights, VAE and text encoders) but train.memory_gb={cap:g}"
            + ("; change: " + "; ".join(hints) if hints else "; no setting of this model fits: a GPU with more memory"))
    return min(n, SAMPLE_BATCH)


def check_generators(cfg, capacity_gb: float | None = None) -> dict[str, float] | None:
    """Refuse (``MemoryPlanError``) a disaggregated config whose generators do not fit ``capacity_gb``
    (default ``train.memory_gb``) with the fragments the run cuts (``generator_items``)."""
    p = inputs_from_config(cfg)
    cap = capacity_gb if capacity_gb is not None else cfg.train.memory_gb
    if p is None or cap is None or cfg.runtime.mode == "colocated":
        return None
    d = cfg.runtime.generator_sequence_parallel.degree
    items = generator_items(cfg, p)
    total = sum(items.values())
    if total > cap * GiB:
        rows = ", ".join(f"{k}={v / GiB:.1f}" for k, v in items.items() if v > 0)
        raise MemoryPlanError(
            f"memory plan: a {FAMILIES[p.family].spec.name} generator needs {total / GiB:.1f} GiB but train.memory_gb="
            f"{cap:g} ({rows}); change: a smaller runtime.fragment_size (now {cfg.runtime.fragment_size})"
            + (f"; runtime.generator_sequence_parallel (now {d})" if p.family in SEQUENCE_PARALLEL_FAMILIES else "")
            + ("; model.prompt_cache_dir (no text encoders on the generators)" if p.text_encoders else ""))
    return items


def resolve_chunk_cells(cfg, trained: int):
    """``cfg`` with ``train.chunk_cells: auto`` turned into a chunk shape that fits ``train.memory_gb``; other
    configs are returned unchanged. Replicated ranks: ``auto_chunk_shape`` of the plan's ``max_cells``. A
    sharded pool (one shard group of N ranks, N x ``max_cells`` per chunk): ``schedule.layout.choose_chunk_shape``,
    the planner's rule, pricing a chunk by its per-rank cells ceil(c / N), so that no chunk leaves a partial round
    that a different shape avoids. ``trained``: trained timesteps per trajectory (S)."""
    t = cfg.train
    if t.chunk_cells != "auto":
        return cfg
    p = inputs_from_config(cfg)
    if t.memory_gb is None or p is None:
        raise MemoryPlanError("train.chunk_cells=auto needs train.memory_gb (the per-rank GPU memory) and a model "
                              f"with a memory plan (model.kind one of {sorted(FAMILIES)}, got {cfg.model.kind!r})")
    fits = plan_memory(p).max_cells(t.memory_gb * GiB)
    if fits < 1:
        check_config(cfg)  # raises with the numbers and the keys
    if t.sharding == "fsdp":  # k shard groups of N lanes: every lane trains ceil(c / N) cells of a chunk, serially
        ranks = lanes(cfg)
        # fewest per-rank cell rounds per group (the planner's rule with per-rank cells as the price), then
        # the larger chunk; a tiny per-chunk term prefers fewer forwards at equal rounds
        cg, ct = choose_chunk_shape(t.generations, trained, t.shard_groups, lambda c: rank_share(c, ranks) + 1e-6,
                                    fits * ranks)
    else:
        cg, ct = auto_chunk_shape(fits, t.generations, trained)
    return cfg.model_copy(update={"train": t.model_copy(update={"chunk_generations": cg, "chunk_timesteps": ct})})
