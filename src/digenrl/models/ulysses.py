"""The Ulysses collectives with their adjoints, on ``torch.distributed`` (``all_to_all_single``, ``all_gather``,
``all_reduce``: each runs on gloo and NCCL), for the plans DigenRL writes itself (``models.hunyuan_video_sp``).

With d ranks, s = S / d local tokens and h = H / d local heads (blocks in rank order)::

    seq_to_heads:  [B, s, H, D] -> [B, S, h, D]   rank r sends its tokens' head slice j to rank j
    heads_to_seq:  [B, S, h, D] -> [B, s, H, D]   the inverse permutation (and each one's adjoint)
    gather_heads:  [B, L, h, D] -> [B, L, H, D]   all-gather of a head slice into a tensor every rank then
                                                  uses alike (replicated downstream)

``gather_heads``'s adjoint is a reduce-scatter: each rank's copy of the gathered tensor gets, in backward, the
gradient of that rank's own uses of it only, so the gradient of slice j is the sum over ranks of their
gradients' slice j (an all-reduce, then the own slice: gloo has no reduce-scatter, and the text tensors
this serves are small).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _all_to_all(x: torch.Tensor, group) -> torch.Tensor:
    """``x`` [d, ...]: block j goes to rank j; returns [d, ...] with block j from rank j."""
    x = x.contiguous()
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out


def _seq_to_heads(x: torch.Tensor, group) -> torch.Tensor:
    d = dist.get_world_size(group)
    B, s, H, D = x.shape
    blocks = x.reshape(B, s, d, H // d, D).permute(2, 0, 1, 3, 4)  # [d, B, s, h, D]: head block j -> rank j
    got = _all_to_all(blocks, group)  # [d, B, s, h, D]: token block j from rank j
    return got.permute(1, 0, 2, 3, 4).reshape(B, d * s, H // d, D)


def _heads_to_seq(y: torch.Tensor, group) -> torch.Tensor:
    d = dist.get_world_size(group)
    B, S, h, D = y.shape
    blocks = y.reshape(B, d, S // d, h, D).permute(1, 0, 2, 3, 4)  # [d, B, s, h, D]: token block j -> rank j
    got = _all_to_all(blocks, group)  # [d, B, s, h, D]: head block j from rank j
    return got.permute(1, 2, 0, 3, 4).reshape(B, S // d, d * h, D)


class _AllToAll(torch.autograd.Function):
    """``_seq_to_heads`` (``to_heads``) or ``_heads_to_seq``; the backward is the other one."""

    @staticmethod
    def forward(ctx, x, group, to_heads: bool):
        ctx.group, ctx.to_heads = group, to_heads
        return (_seq_to_heads if to_heads else _heads_to_seq)(x, group)

    @staticmethod
    def backward(ctx, grad):
        return (_heads_to_seq if ctx.to_heads else _seq_to_heads)(grad, ctx.group), None, None


class _GatherHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, group):
        ctx.group = group
        parts = [torch.empty_like(y) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, y.contiguous(), group=group)
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        d, r = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        return grad.chunk(d, dim=2)[r].contiguous(), None


def seq_to_heads(x: torch.Tensor, group) -> torch.Tensor:
    """[B, S/d, H, D] (this rank's tokens, every head) -> [B, S, H/d, D] (every token, this rank's heads)."""
    return _AllToAll.apply(x, group, True)


def heads_to_seq(y: torch.Tensor, group) -> torch.Tensor:
    """[B, S, H/d, D] -> [B, S/d, H, D] (the inverse of ``seq_to_heads``)."""
    return _AllToAll.apply(y, group, False)


def gather_heads(y: torch.Tensor, group) -> torch.Tensor:
    """[B, L, H/d, D] -> [B, L, H, D] on every rank (backward: the summed gradient's own slice)."""
    return _GatherHeads.apply(y, group)


def head_slice(x: torch.Tensor, group) -> torch.Tensor:
    """This rank's heads of a tensor every rank holds whole, [B, L, H, D] -> [B, L, H/d, D]."""
    d, r = dist.get_world_size(group), dist.get_rank(group)
    return x.chunk(d, dim=2)[r]
