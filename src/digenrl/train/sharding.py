"""The sharded trainer pool (``train.sharding: fsdp``): PyTorch FSDP2 over the trainer ranks.

``shard_context`` applies ``fully_shard`` to every transformer block, then to the transformer (the root), and
rebuilds the optimizer, the gradient transaction and the EMA over the sharded parameters, so weights, grads,
AdamW state and EMA are each 1/N per rank. The KL reference of full fine-tuning (``beta_kl > 0``) becomes its
own frozen FSDP module (1/N of the initial weights per rank); under LoRA it stays "adapters disabled" and with
``beta_kl = 0`` there is none. Under mixed precision FSDP gathers 16-bit blocks
(``MixedPrecisionPolicy(param_dtype, reduce_dtype=float32)``) instead of autocast keeping 16-bit copies.

Gradient reduction: every chunk's backward reduce-scatters its block gradients (SUM, divide factor 1) into the
sharded fp32 ``.grad`` of each rank, which accumulate over the step's chunks; the commit then only clips
(the global norm over the shards) and steps the local shards. We chose this over keeping unsharded gradients
until the commit (``set_requires_gradient_sync(False)``): that would hold a full fp32 gradient per rank
(4 x params bytes, 48 GB for FLUX.1) and defeat the sharding; the reduce-scatter rides on a backward that
is a collective anyway (it all-gathers the blocks). Sum over ranks and chunks = the unsharded transaction's
all-reduced sum, so the committed update is the same (I1).

Collectives: a forward or backward all-gathers every block, so all ranks of the pool run each training chunk
together (``rank_cells`` splits a chunk's cells over the ranks; a rank left without one runs a weight-0 cell:
``step_math.kept_cells``) and generate together (TAG as a collective action: each rank samples its
own fragment of the same size, the forwards are matched one to one). Publishing gathers the full trainable state on every rank
(``full_trainable_state``, collective). Checkpoints: ``torch.distributed.checkpoint`` (each rank writes its
shards; resumable).
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

import torch

from digenrl.train.context import attach_copies, make_optimizer
from digenrl.train.transaction import GradientTransaction


def block_lists(policy) -> list[torch.nn.ModuleList]:
    """The transformer block lists of a policy (the FSDP units)."""
    if hasattr(policy, "net") and hasattr(policy.net, "blocks"):  # built-in tiny DiT
        return [policy.net.blocks]
    root = policy.transformer
    out = []
    for name in ("transformer_blocks", "single_transformer_blocks", "blocks"):
        if isinstance(getattr(root, name, None), torch.nn.ModuleList):
            out.append(getattr(root, name))
    if not out:
        raise ValueError(f"train.sharding=fsdp: no transformer block list found in {type(root).__name__}")
    return out


def sharded_root(policy) -> torch.nn.Module:
    return policy.net if hasattr(policy, "net") else policy.transformer


def device_mesh(group=None, device_type: str = "cpu"):
    """A 1-D device mesh over ``group`` (None: the default world)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    if group is None:
        return init_device_mesh(device_type, (dist.get_world_size(),))
    return DeviceMesh.from_group(group, device_type)


def shard_policy(policy, mesh, precision=None, cpu_offload: bool = False) -> None:
    """``fully_shard`` per block, then the root; gradients are summed over ranks (not averaged).
    ``cpu_offload``: the shards (weights, grads, hence AdamW state and EMA) live in host memory and the
    optimizer steps on the CPU (``CPUOffloadPolicy``); the device holds only the gathered blocks."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mp = MixedPrecisionPolicy()
    if precision is not None and precision.dtype is not None:
        mp = MixedPrecisionPolicy(param_dtype=precision.dtype, reduce_dtype=torch.float32)
    off = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if cpu_offload else OffloadPolicy()
    for blocks in block_lists(policy):
        for blk in blocks:
            fully_shard(blk, mesh=mesh, mp_policy=mp, offload_policy=off)
    root = sharded_root(policy)
    fully_shard(root, mesh=mesh, mp_policy=mp, offload_policy=off)
    from torch.distributed.fsdp import FSDPModule

    for m in root.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)  # SUM over ranks, as the unsharded transaction's all-reduce
            m.set_force_sum_reduction_for_comms(True)  # plain SUM collectives (gloo has no PREMUL_SUM)


def shard_context(ctx, group=None, replica_group=None) -> None:
    """Shard ``ctx.policy`` over ``group`` and rebuild its optimizer, transaction and EMA (same version);
    ``replica_group``: hybrid sharding's (``GradientTransaction._all_reduce``)."""
    cfg = ctx.cfg
    device_type = next(ctx.policy.parameters()).device.type
    prec = getattr(ctx.policy, "precision", None)
    mesh = device_mesh(group, device_type)
    off = cfg.train.cpu_offload
    if ctx.ref_policy is not None and not cfg.model.lora.enabled:
        ctx.ref_policy = _sharded_reference(ctx.policy, ctx.ref_policy, mesh, prec, off)
    shard_policy(ctx.policy, mesh, prec, off)
    old = ctx.transaction
    ctx.optimizer = make_optimizer(ctx.policy, cfg)
    ctx.transaction = GradientTransaction(ctx.policy.parameters(), ctx.optimizer, max_grad_norm=old.max_grad_norm,
                                          version=old.version, process_group=group, precision=old.precision)
    ctx.transaction.sharded = True
    ctx.transaction.replica_group = replica_group
    attach_copies(ctx)  # the EMA, DiffusionNFT's old copy and recompute's step-start copy, of the shards


def _sharded_reference(policy, ref_policy, mesh, prec, cpu_offload=False):
    """The full fine-tuning KL reference as its own frozen FSDP module (1/N of the initial weights per rank):
    a deep copy of the trainable root holding the build-time snapshot; its forward is a collective too."""
    if ref_policy is not policy and not hasattr(ref_policy, "policy"):  # a separate frozen copy (tiny DiT)
        shard_policy(ref_policy, mesh, prec, cpu_offload)
        return ref_policy
    root_name = "net" if hasattr(policy, "net") else "transformer"
    ref_root = copy.deepcopy(getattr(policy, root_name))
    snap = getattr(policy, "_reference_snapshot", None)
    if snap:
        with torch.no_grad():
            params = dict(ref_root.named_parameters())
            for k, v in snap.items():
                params[k].copy_(v)
        policy._reference_snapshot = None  # the sharded copy replaces the full snapshot
    ref_root.requires_grad_(False)

    class _Holder(torch.nn.Module):  # block_lists / sharded_root work on it like on a policy
        pass

    holder = _Holder()
    setattr(holder, root_name, ref_root)
    shard_policy(holder, mesh, prec, cpu_offload)

    @contextmanager
    def swapped():
        live = policy._modules[root_name]
        policy._modules[root_name] = ref_root
        try:
            yield
        finally:
            policy._modules[root_name] = live

    from digenrl.models.diffusers_common import ReferenceView

    # the policy's own forward with the frozen sharded root swapped in (``train.sequence_parallel`` splits its
    # sequence too: ``root``)
    return ReferenceView(policy, swapped, ref_root)


def rank_cells(cells: Sequence, rank: int, world: int) -> tuple[list, float]:
    """This rank's share of a chunk's cells (round robin) and its loss weight: a rank with no cell trains the
    chunk's first cell with weight 0 so that its forward/backward still joins the collectives."""
    mine = list(cells[rank::world])
    return (mine, 1.0) if mine else (list(cells[:1]), 0.0)


def full_trainable_state(policy) -> dict[str, torch.Tensor]:
    """The trainable tensors, gathered to full CPU tensors on every rank (a collective under FSDP)."""
    return full_state(policy.trainable_state_dict())


def full_state(state: dict) -> dict[str, torch.Tensor]:
    """``state`` with every sharded tensor gathered to a full CPU tensor (a collective: every rank calls it with
    the same keys, in the same order)."""
    out = {}
    for name, t in state.items():
        full = t.full_tensor() if hasattr(t, "full_tensor") else t
        out[name] = full.detach().to("cpu", copy=True)
    return out


def _dcp_state(ctx) -> dict:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    root = sharded_root(ctx.policy)
    state = {"model": get_model_state_dict(root), "optim": get_optimizer_state_dict(root, ctx.optimizer)}
    if ctx.ema is not None:
        state["ema"] = dict(ctx.ema.shadow)
    if getattr(ctx.policy, "nft_old", None) is not None:  # DiffusionNFT's old copy (train.nft_old)
        state["nft_old"] = dict(ctx.policy.nft_old.shadow)
        state["meta"] = {"nft_old_commits": torch.tensor(ctx.policy.nft_old.commits)}
    return state


def save_sharded(ctx, path: str | Path) -> None:
    """Every rank writes its shards of weights, AdamW state and EMA (``torch.distributed.checkpoint``)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(_dcp_state(ctx), checkpoint_id=str(path), process_group=ctx.transaction.process_group)


def load_sharded(ctx, path: str | Path) -> None:
    """Load a ``save_sharded`` checkpoint into the (already sharded) context, in place. The version, EMA update
    count, loss scale and RNG come from the checkpoint's ``TrainState`` (``checkpoint.restore_counters``)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    state = _dcp_state(ctx)  # (the meta's values are placeholders: loaded in place like every tensor)
    dcp.load(state, checkpoint_id=str(path), process_group=ctx.transaction.process_group)
    root = sharded_root(ctx.policy)
    set_model_state_dict(root, state["model"])
    set_optimizer_state_dict(root, ctx.optimizer, state["optim"])
    if "nft_old" in state:  # (the EMA's and the old copy's shards are loaded in place)
        ctx.policy.nft_old.commits = int(state["meta"]["nft_old_commits"])

