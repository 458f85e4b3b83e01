"""Sequence (context) parallelism of a policy's transformer: d ranks split every sample's latent tokens and run
each forward together (Ulysses; docs/sequence_parallel.md).

Per forward of a group of d ranks (one sequence of S latent tokens, H heads)::

    tokens   : each rank holds S / d tokens of every sample (split after the patch embedding, RoPE alike)
    attention: all-to-all  [B, S/d, H, D] -> [B, S, H/d, D]   (every token, a slice of the heads)
               attention over the whole sequence on the local heads
               all-to-all  [B, S, H/d, D] -> [B, S/d, H, D]   (back to the token split)
    output   : all-gather of the S / d output tokens before the unpatchify (every rank gets the velocity)

Everything outside attention acts per token, so a rank computes exactly its tokens' part of the unsplit
forward. Why the d ranks' parameter gradients sum to the unsplit gradient (which the trainer sums), and which plan
``enable_sequence_parallel`` applies to each family (``wan``: diffusers' ``_cp_plan``; ``hunyuan_video``:
``models.hunyuan_video_sp``): docs/sequence_parallel.md.

Workarounds for diffusers 0.42.1 with torch 2.13 (``context_parallel_config``, ``_enable_diffusers_plan``):

* ``ModelMixin.enable_parallelism``'s ``_resolve_parallel_config`` builds the device as ``rank %
  torch.accelerator.device_count()``, which is ``ZeroDivisionError: integer modulo by zero`` on a CPU-only
  machine, and takes the world's rank and size (a sequence group is a subgroup of the trainer pool, beside the
  generators of a broadcast publish): we give the model a resolver that returns our config (the instance's
  ``_resolve_parallel_config``).
* ``ContextParallelConfig.setup`` flattens its (ring, ulysses) mesh with ``DeviceMesh._flatten``, which creates
  a process group with ``new_group`` on the ranks of that mesh only: a world collective whose name comes from a
  per-process counter. Two sequence groups flattening at once create two groups of the same name over
  different ranks, which rendezvous under the same keys of the world's store; with 4 ranks in 2 groups (under
  FSDP) we saw runs hang in the first forward and runs whose groups exchanged each other's tokens (trained
  weights off the reference). We fill the config's runtime fields ourselves on a one-dimensional mesh over the
  group the trainer already created (``DeviceMesh.from_group``: no new group); ring degree 1 needs no ring mesh.

The rest of ``enable_parallelism`` (backend check, processors, hooks) runs as shipped; everything runs on gloo
(``tests/models/test_sequence_parallel.py``, ``tests/runtime/test_sequence_parallel_pool.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from digenrl.models.specs import SEQUENCE_PARALLEL_FAMILIES


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
    """Latent tokens of one sample after the patch embedding (``LatentGrid.tokens`` of the policy's grid)."""
    return policy.latent_grid().tokens(*policy.sample_size())


def check_divisible(policy, degree: int, key: str = "train.sequence_parallel") -> None:
    """``check_degree`` of the built policy."""
    name = getattr(getattr(policy, "spec", None), "name", type(policy).__name__)
    if name not in SEQUENCE_PARALLEL_FAMILIES:
        raise ValueError(f"{key}: model.kind {name!r} has no sequence-parallel plan (supported: "
                         f"{', '.join(sorted(SEQUENCE_PARALLEL_FAMILIES))})")
    check_degree(name, policy.transformer.config.num_attention_heads, sequence_length(policy), degree, key)


def check_degree(name: str, heads: int, tokens: int, degree: int, key: str) -> None:
    """The degree must divide the heads (Ulysses gives each rank H / d of them) and the latent tokens (each rank
    holds S / d): a ``ValueError`` naming the keys otherwise. ``digenrl check`` / ``train`` run it on the
    directory's configs before anything loads; the policy's build on its modules."""
    if heads % degree:
        raise ValueError(f"{key}: degree {degree} does not divide the {heads} attention heads of the {name} "
                         "transformer (Ulysses gives each rank heads / degree of them)")
    if tokens % degree:
        raise ValueError(f"{key}: degree {degree} does not divide the {tokens} latent tokens of a sample "
                         f"(model.options height / width / frames; each rank holds tokens / degree of them)")


def enable_sequence_parallel(policy, group, key: str = "train.sequence_parallel") -> SequenceGroup:
    """Split ``policy.transformer``'s sequence over ``group`` (in place; every rank of the group calls it)."""
    sg = sequence_group(group)
    check_divisible(policy, sg.degree, key)
    split_transformer(policy.spec.name, policy.transformer, sg)
    policy.sequence_group = sg
    return sg


def split_transformer(family: str, transformer, sg: SequenceGroup) -> None:
    """Apply ``family``'s plan to ``transformer`` (also a frozen copy of a policy's, e.g. a sharded KL reference)."""
    if family == "hunyuan_video":
        from digenrl.models.hunyuan_video_sp import enable

        enable(transformer, sg, context_parallel_config(transformer, sg))
    else:
        _enable_diffusers_plan(transformer, sg)


def context_parallel_config(transformer, sg: SequenceGroup):
    """diffusers' ``ContextParallelConfig(ulysses_degree=d)`` set up on ``sg``'s ranks: a one-dimensional
    ``DeviceMesh`` over the group (``DeviceMesh.from_group``: no new process group) as its Ulysses and flattened
    mesh, and the transformer's device. The fields are those ``ContextParallelConfig.setup`` fills, without its
    ``DeviceMesh._flatten`` (see the module doc)."""
    from diffusers import ContextParallelConfig
    from torch.distributed.device_mesh import DeviceMesh

    device = next(transformer.parameters()).device
    mesh = DeviceMesh.from_group(sg.group, device.type, mesh_dim_names=("ulysses",))
    cp = ContextParallelConfig(ulysses_degree=sg.degree, mesh=mesh)
    cp._rank, cp._world_size, cp._device, cp._mesh = sg.rank, sg.degree, device, mesh
    cp._flattened_mesh = cp._ulysses_mesh = mesh
    cp._ring_mesh, cp._ring_local_rank, cp._ulysses_local_rank = None, 0, sg.rank  # (ring_degree = 1: unused)
    return cp


def _enable_diffusers_plan(transformer, sg: SequenceGroup) -> None:
    """diffusers' ``enable_parallelism`` with the model's ``_cp_plan`` on ``sg``'s ranks (see the module doc for the
    resolver we give it)."""
    from diffusers.models._modeling_parallel import ParallelConfig
    from diffusers.utils import logging

    cp = context_parallel_config(transformer, sg)

    def resolve(config):
        out = ParallelConfig(context_parallel_config=cp)
        out._rank, out._world_size, out._device, out._mesh = sg.rank, sg.degree, cp._device, cp._mesh
        transformer._parallel_config = out
        return out

    transformer._resolve_parallel_config = resolve  # the instance's, ahead of the class method
    level = logging.get_verbosity()
    logging.set_verbosity_error()  # without diffusers' "experimental feature" warning (logged on every call)
    try:
        transformer.enable_parallelism(config=cp)
    finally:
        logging.set_verbosity(level)
