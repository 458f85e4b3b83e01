"""Everything a training run holds, built once from the config: policy, reference, reward, task, optimizer,
gradient transaction, EMA, and the sampler / loss settings derived from the config."""

from __future__ import annotations

import copy
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from digenrl.algo.timesteps import TimestepPlan
from digenrl.config import Config
from digenrl.control.run_plan import timestep_plan
from digenrl.models.base import Policy
from digenrl.rewards.base import WeightedSum
from digenrl.rollout.sampler import SamplerSettings
from digenrl.tasks.base import Task
from digenrl.train.chunk_loss import LossSettings
from digenrl.train.ema import ParamEMA, make_ema
from digenrl.train.nft_old import attach as attach_old
from digenrl.train.old_logprob import attach as attach_step_start
from digenrl.train.precision import prepare_policy
from digenrl.train.sample_masks import reward_weights
from digenrl.train.transaction import GradientTransaction


@dataclass
class RunContext:
    cfg: Config
    policy: Policy
    ref_policy: Policy | None
    reward: WeightedSum
    task: Task
    optimizer: torch.optim.Optimizer
    transaction: GradientTransaction
    ema: ParamEMA | None
    sampler: SamplerSettings
    loss: LossSettings

    def plan(self, step: int) -> TimestepPlan:
        return timestep_plan(self.cfg, step)

    def eval_weights(self):
        """Context in which ``policy`` holds the weights to evaluate/save (EMA if enabled)."""
        return self.ema.swapped() if self.ema is not None else nullcontext()


def sampler_settings(cfg: Config) -> SamplerSettings:
    s = cfg.sampler
    return SamplerSettings(num_steps=s.num_steps, noise_level=s.noise_level, kind=s.kind, cfg_scale=s.cfg_scale,
                           eval_cfg_scale=s.eval_cfg_scale, same_latent=s.same_latent, static_shift=s.static_shift,
                           integer_timesteps=bool(s.integer_timesteps), record_means=cfg.train.algorithm == "grpo_guard",
                           record_cells=cfg.train.algorithm != "nft",
                           ode_solver=s.nft_solver if cfg.train.algorithm == "nft" else "euler",
                           post_solver=s.post_solver, post_compress_ratio=s.post_compress_ratio)


def loss_settings(cfg: Config) -> LossSettings:
    s, t = cfg.sampler, cfg.train
    return LossSettings(
        clip_range=t.clip_range,
        beta_kl=t.beta_kl,
        cfg_scale=s.cfg_scale if t.cfg_in_training else 1.0,
        noise_level=s.noise_level,
        kind=s.kind,
        kl_form=t.kl_form,
        clip_low=t.clip_range_low,
        clip_high=t.clip_range_high,
        guidance=s.cfg_scale,  # a guidance embedding always gets the sampling scale (Flow-GRPO's FLUX scripts)
        filter_zero_advantage=t.filter_zero_advantage,
        detach_uncond=t.cfg_detach_uncond,
        integer_timesteps=s.integer_timesteps is True,  # "sampling" (DiffusionNFT): float time in training
        adv_weights=tuple(reward_weights(cfg).values()) if t.adv_per_reward else None,
        reward_aggregation=t.reward_mix,
        guard_bias=t.guard_bias,
        algorithm=t.algorithm,
        adv_clip_max=t.adv_clip_max,
        nft_beta=t.nft_beta,
        old_logprob=t.old_logprob,
        tis_cap=t.tis_cap,
    )


def make_reference(policy: Policy) -> Policy:
    """The frozen reference for the KL term: the policy's own (e.g. adapters disabled) or a frozen copy."""
    if hasattr(policy, "make_reference"):
        return policy.make_reference()
    ref = copy.deepcopy(policy)
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref.eval()


def make_optimizer(policy: Policy, cfg: Config) -> torch.optim.Optimizer:
    params = [p for p in policy.parameters() if p.requires_grad]
    if not params:
        raise ValueError("model: the policy has no trainable parameters")
    t = cfg.train
    return torch.optim.AdamW(params, lr=t.lr, betas=t.betas, weight_decay=t.weight_decay, eps=t.adam_epsilon)


def model_config_for(cfg: Config, task: Task):
    """``cfg.model``, with ``load_text_encoders: false`` when it is ``auto`` and the prompt cache already holds
    every prompt of the task (train, eval and the negative prompt): workers then never load the encoders."""
    m = cfg.model
    if m.options.get("load_text_encoders", "auto") != "auto" or not m.prompt_cache_dir or not hasattr(task, "all_texts"):
        return m
    from digenrl.models.registry import prompt_cache_covers

    if not prompt_cache_covers(m, task.all_texts()):
        return m
    return m.model_copy(update={"options": {**m.options, "load_text_encoders": False}})


def build_context(cfg: Config, *, policy: Policy | None = None, reward: WeightedSum | None = None, task: Task | None = None) -> RunContext:
    from digenrl.models.registry import build_policy
    from digenrl.rewards.registry import build_weighted
    from digenrl.tasks.base import build_task

    torch.manual_seed(cfg.seed)
    task = task if task is not None else build_task(cfg.task)
    policy = policy if policy is not None else build_policy(model_config_for(cfg, task))
    reward = reward if reward is not None else build_weighted(cfg.reward)
    precision = prepare_policy(policy, cfg)  # fp32 masters, recomputation, no unneeded reference copy
    optimizer = make_optimizer(policy, cfg)
    transaction = GradientTransaction(policy.parameters(), optimizer, max_grad_norm=cfg.train.max_grad_norm,
                                      precision=precision if cfg.train.mixed_precision == "fp16" else None)
    ctx = RunContext(
        cfg=cfg,
        policy=policy,
        ref_policy=make_reference(policy) if cfg.train.beta_kl > 0 else None,
        reward=reward,
        task=task,
        optimizer=optimizer,
        transaction=transaction,
        ema=None,
        sampler=sampler_settings(cfg),
        loss=loss_settings(cfg),
    )
    attach_copies(ctx)
    return ctx


def attach_copies(ctx: RunContext) -> None:
    """(Re)build the copies of the trainable parameters a run keeps, after the reference's copy (and, in
    ``train.sharding.shard_context``, of the shards): the EMA (``train.ema_decay`` / ``ema_every`` / ``ema_warmup``
    / ``ema_update``), DiffusionNFT's old policy (``train.nft_old_policy=soft``) and the step-start snapshot
    (``train.old_logprob=recompute`` with several rounds per step)."""
    t = ctx.cfg.train
    ctx.ema = make_ema(ctx.policy, t)
    attach_old(ctx.policy, t)
    attach_step_start(ctx.policy, t, ctx.transaction.version)
