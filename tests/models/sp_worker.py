"""Processes of the sequence-parallel model tests (spawned; gloo on CPU). Each rank writes ``out/rank{r}.json``.

Oracle: the same policy before its sequence is split (diffusers' own forward and autograd, in the same process,
same weights and inputs): the velocity, the sampled trajectories and log-probs, and the gradient of a chunk's
loss (``train_cells``), which the ranks' partial gradients must sum to.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch


def _policy(family: str, model_dir: str, cache_dir: str, options: dict, lora: bool):
    from digenrl.config import LoraConfig, ModelConfig
    from digenrl.models.registry import build_policy

    cfg = ModelConfig(kind=family, path=model_dir, prompt_cache_dir=cache_dir, options=options,
                      lora=LoraConfig(enabled=lora, rank=4, alpha=8.0))
    return build_policy(cfg)


def _key_bias(name: str) -> bool:
    """An attention key bias: softmax ignores it, so its exact gradient is 0 and what it gets is rounding noise
    (compared only inside the global norm)."""
    return name.endswith(("to_k.bias", "add_k_proj.bias"))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def run(rank: int, world: int, port: int, family: str, model_dir: str, cache_dir: str, options: dict, cfg_scale: float,
        lora: bool, out: str) -> None:
    import torch.distributed as dist

    from digenrl.algo.timesteps import select_timesteps
    from digenrl.models.base import guided_velocity
    from digenrl.models.sequence_parallel import enable_sequence_parallel, sequence_length
    from digenrl.rollout.records import Prompt
    from digenrl.rollout.sampler import SamplerSettings, sample_trajectories
    from digenrl.train.chunk_loss import LossSettings, train_cells

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        policy = _policy(family, model_dir, cache_dir, options, lora)
        prompts = [Prompt(uid=0, text="a red cat"), Prompt(uid=1, text="a big dog")]
        settings = SamplerSettings(num_steps=3, noise_level=0.7, cfg_scale=cfg_scale)
        plan = select_timesteps(3, fraction=1.0)
        loss = LossSettings(cfg_scale=cfg_scale, guidance=cfg_scale, noise_level=0.7)

        def sample():
            return sample_trajectories(policy, prompts * 2, [0, 0, 1, 1], step=0, run_seed=5, version=0,
                                       settings=settings, plan=plan, decode=False)

        def grads(batch):
            policy.zero_grad(set_to_none=True)
            cells = [(g, j) for g in (0, 1) for j in range(len(plan.trained))]
            train_cells(policy, batch, cells, settings=loss, loss_scale=0.25)
            return {n: p.grad.detach().clone() for n, p in policy.named_parameters() if p.grad is not None}

        ref_batch = sample()
        group = ref_batch.select([0, 2])  # prompt 0, generations 0 and 1
        group.advantages = torch.tensor([1.0, -0.5])
        x = ref_batch.latents[:, 1]
        sigma = torch.full((4,), 0.6)
        cond = policy.encode_prompts(prompts * 2)
        with torch.no_grad():
            v_ref = guided_velocity(policy, x, sigma, cond, cfg_scale, guidance=cfg_scale)
        g_ref = grads(group)

        from torch.distributed.distributed_c10d import _world

        groups = [dist.new_group(list(range(i, i + 2))) for i in range(0, world, 2)]  # (as the trainer does)
        pg = groups[rank // 2]
        before = (_world.group_count, len(_world.pg_map))
        enable_sequence_parallel(policy, pg)
        created = (_world.group_count - before[0], len(_world.pg_map) - before[1])
        tr = policy.transformer
        attn = tr.blocks[0].attn1 if family == "wan" else tr.transformer_blocks[0].attn  # the first self-attention
        seen = []
        attn.register_forward_pre_hook(lambda m, a, kw: seen.append(int((a or (kw["hidden_states"],))[0].shape[1])),
                                       with_kwargs=True)
        with torch.no_grad():
            v_sp = guided_velocity(policy, x, sigma, cond, cfg_scale, guidance=cfg_scale)
        sp_batch = sample()
        g_sp = grads(group)
        for g in g_sp.values():
            dist.all_reduce(g, group=pg)  # the sequence group's ranks each hold a part of the gradient
        rels = {n: _rel(g_sp[n], g_ref[n]) for n in g_ref if not _key_bias(n)}
        worst = max(rels, key=rels.get)
        result = {
            "velocity": _rel(v_sp, v_ref), "block_tokens": seen[0], "groups_created": list(created),
            "tokens": sequence_length(policy),
            "velocity_moved": _rel(torch.zeros_like(v_ref), v_ref),
            "final": _rel(sp_batch.final, ref_batch.final),
            "log_probs": float((sp_batch.log_probs - ref_batch.log_probs).abs().max()),
            "grad_worst": rels[worst], "grad_worst_name": worst, "grad_names": sorted(g_sp) == sorted(g_ref),
            "n_grads": len(g_ref),
            "grad_global": (sum(float((g_sp[n] - g_ref[n]).square().sum()) for n in g_ref)
                            / sum(float(g_ref[n].square().sum()) for n in g_ref)) ** 0.5,
        }
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()  # rank 0 hosts the store: it stays until every rank is done
    finally:
        dist.destroy_process_group()
    os._exit(0)
