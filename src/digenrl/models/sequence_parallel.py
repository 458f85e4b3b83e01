"""Sequence (context) parallelism of a policy's transformer: d ranks split every sample's latent tokens and run
each forward together (Ulysses; docs/sequence_parallel.md).

Per forward of a group of d ranks (one sequence of S latent tokens, H heads)::

    tokens   : each rank holds S / d tokens of every sample (split after the patch embedding, RoPE alike)
    attention: all-to-all  [B, S/d, H, D] -> [B, S, H/d, D]   (every token, a slice of the heads)
               attention over the whole sequence on the local heads
               all-to-all  [B, S, H/d, D] -> [B, S/d, H, D]   (back to the token split)
    output   : all-gather of the S / d output tokens before the unpatchify (every rank gets the velocity)

Everything outside attention acts per token, so a rank computes exactly its tokens' part of the unsplit
forward. Backward: the all-to-alls are each other's adjoints; the output gather's adjoint is "keep my slice"
(every rank computes the same loss from the gathered velocity and counts it once); computations every rank
repeats (timestep and text embeddings, the text stream) get on each rank the gradient of that rank's uses of
them only, so **the parameter gradients of the d ranks sum to the unsplit gradient**: the trainer sums them
(the commit's all-reduce, or FSDP's reduce-scatter over a shard group that contains the sequence group).

Two plans, applied by ``enable_sequence_parallel``:

* ``wan``: diffusers' own (``WanTransformer3DModel._cp_plan`` with ``ContextParallelConfig(ulysses_degree=d)``:
  split hooks on ``rope`` and ``blocks.0``, gather on ``proj_out``, ``TemplatedUlyssesAttention`` in the self
  attention; the text cross-attention keys and values stay whole on every rank).
* ``hunyuan_video``: DigenRL's (``models.hunyuan_video_sp``): diffusers 0.42 declares no ``_cp_plan`` for it.

Two workarounds for diffusers 0.42.1 (``ModelMixin.enable_parallelism``), both in ``_enable_diffusers_plan``:
its ``_resolve_parallel_config`` builds the device as ``rank % torch.accelerator.device_count()``, which is
``ZeroDivisionError: integer modulo by zero`` on a CPU-only machine, and takes the world's rank and size (a
sequence group is a subgroup of the trainer pool, beside the generators of a broadcast publish); we give the
model a resolver that sets the config up on our mesh (the group's ``DeviceMesh.from_group``, with a
one-rank ``ring`` dimension) and the policy's device. The rest of ``enable_parallelism`` (backend check,
processors, hooks) runs as shipped; everything works on gloo (``tests/models/test_sequence_parallel.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from digenrl.config import SEQUENCE_PARALLEL_FAMILIES


@dataclass(frozen=True)
class SequenceGroup:
    """The torch.distributed group of d ranks that splits one sequence, and this rank's place in it."""

    group: object
    degree: int
    rank: int  # this rank's index in the group (its block of tokens)


def sequence_group(group) -> SequenceGroup:
    import torch.distributed as dist

    return SequenceGroup(group, dist.get_world_size(group), dist.get_rank(group))


def sequence_length(policy) -> int:
    """Latent tokens of one sample after the patch embedding (``policy.latent_shape`` = (C, F, H, W))."""
    c = policy.transformer.config
    _, f, h, w = policy.latent_shape
    if policy.spec.name == "wan":
        pt, ph, pw = c.patch_size
    else:
        pt, ph, pw = c.patch_size_t, c.patch_size, c.patch_size
    return (f // pt) * (h // ph) * (w // pw)


def check_divisible(policy, degree: int, key: str = "train.sequence_parallel") -> None:
    """The degree must divide the heads (Ulysses gives each rank H / d of them) and the latent tokens (each rank
    holds S / d): a ``ValueError`` naming the keys otherwise."""
    name = getattr(getattr(policy, "spec", None), "name", type(policy).__name__)
    if name not in SEQUENCE_PARALLEL_FAMILIES:
        raise ValueError(f"{key}: model.kind {name!r} has no sequence-parallel plan (supported: "
                         f"{', '.join(sorted(SEQUENCE_PARALLEL_FAMILIES))})")
    heads = policy.transformer.config.num_attention_heads
    if heads % degree:
        raise ValueError(f"{key}: degree {degree} does not divide the {heads} attention heads of the {name} "
                         "transformer (Ulysses gives each rank heads / degree of them)")
    tokens = sequence_length(policy)
    if tokens % degree:
        raise ValueError(f"{key}: degree {degree} does not divide the {tokens} latent tokens of a sample "
                         f"(model.options height / width / frames; each rank holds tokens / degree of them)")


def enable_sequence_parallel(policy, group, key: str = "train.sequence_parallel") -> SequenceGroup:
    """Split ``policy.transformer``'s sequence over ``group`` (in place; every rank of the group calls it)."""
    sg = sequence_group(group)
    check_divisible(policy, sg.degree, key)
    if policy.spec.name == "hunyuan_video":
        from digenrl.models.hunyuan_video_sp import enable

        enable(policy.transformer, sg)
    else:
        _enable_diffusers_plan(policy.transformer, sg)
    policy.sequence_group = sg
    return sg


def context_parallel_config(transformer, sg: SequenceGroup):
    """diffusers' ``ContextParallelConfig(ulysses_degree=d)`` set up on ``sg``'s ranks: a ``DeviceMesh`` of the
    group (``DeviceMesh.from_group``, with a one-rank ``ring`` dimension) and the transformer's device."""
    import torch
    import torch.distributed as dist
    from diffusers import ContextParallelConfig
    from torch.distributed.device_mesh import DeviceMesh

    device = next(transformer.parameters()).device
    ranks = dist.get_process_group_ranks(sg.group)
    solo = dist.new_group([dist.get_rank()], use_local_synchronization=True)  # the one-rank "ring" dimension
    mesh = DeviceMesh.from_group([solo, sg.group], device.type, mesh=torch.tensor(ranks).view(1, sg.degree),
                                 mesh_dim_names=("ring", "ulysses"))
    cp = ContextParallelConfig(ulysses_degree=sg.degree, mesh=mesh)
    cp.setup(sg.rank, sg.degree, device, mesh)
    return cp


def _enable_diffusers_plan(transformer, sg: SequenceGroup) -> None:
    """diffusers' ``enable_parallelism`` with the model's ``_cp_plan`` on ``sg``'s ranks (see the module doc for the
    resolver we give it)."""
    from diffusers.models._modeling_parallel import ParallelConfig

    cp = context_parallel_config(transformer, sg)

    def resolve(config):
        out = ParallelConfig(context_parallel_config=cp)
        out.setup(sg.rank, sg.degree, cp._device, mesh=cp._mesh)  # (the config above, set up once more alike)
        transformer._parallel_config = out
        return out

    transformer._resolve_parallel_config = resolve  # the instance's, ahead of the class method
    _quiet_diffusers(transformer.enable_parallelism, config=cp)


def _quiet_diffusers(fn, **kwargs):
    """``fn(**kwargs)`` without diffusers' "experimental feature" warning (logged on every call)."""
    from diffusers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        return fn(**kwargs)
    finally:
        logging.set_verbosity(level)
