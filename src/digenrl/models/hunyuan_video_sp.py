"""DigenRL's Ulysses plan for ``HunyuanVideoTransformer3DModel`` (diffusers 0.42 declares no ``_cp_plan`` for it).

Layout: the latent (image) tokens are split over the d ranks of the group, the text tokens are not (every rank
runs the text refiner and the text stream of the dual-stream blocks on all L of them; L is small). The split
and gather follow the pattern of diffusers' plans, with its own hooks (``diffusers.hooks.context_parallel``)::

    x_embedder : output [B, S, C]      -> this rank's S / d tokens
    rope       : outputs [S, D/2] x 2  -> this rank's S / d rows
    proj_out   : output [B, S/d, C']   -> all-gathered to [B, S, C'] (adjoint: the own slice)

and every joint attention (``transformer_blocks``, ``single_transformer_blocks``) gets ``UlyssesJointAttnProcessor``::

    image q, k, v [B, S/d, H, D] --seq_to_heads--> [B, S, H/d, D]
    text  q, k, v [B, L, H, D]   --head_slice-->   [B, L, H/d, D]
    attention over [S image ; L text] tokens on the H / d local heads (the model's key mask, whole)
    image out  --heads_to_seq--> [B, S/d, H, D];   text out --gather_heads--> [B, L, H, D] on every rank

The model builds its attention mask from the split sequence ([B, 1, 1, S/d + L], text padding masked at the
end); the processor rebuilds it for the whole sequence (every image token attended, the text part as given).
The adjoint of each collective is in ``models.ulysses``; why the ranks' gradients then sum to the unsplit
gradient is in docs/sequence_parallel.md. HunyuanVideo's image-to-video variant (``image_condition_type =
"token_replace"``) numbers tokens of the first frame and is refused.
"""

from __future__ import annotations

import torch

from digenrl.models.ulysses import gather_heads, head_slice, heads_to_seq, seq_to_heads


def plan():
    """The split/gather hooks (diffusers' ``ContextParallelModelPlan`` format)."""
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    return {
        "x_embedder": {0: ContextParallelInput(split_dim=1, expected_dims=3, split_output=True)},
        "rope": {0: ContextParallelInput(split_dim=0, expected_dims=2, split_output=True),
                 1: ContextParallelInput(split_dim=0, expected_dims=2, split_output=True)},
        "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3),
    }


def enable(transformer, sg, cp) -> None:
    """Apply the plan and the processors to ``transformer`` over the ``SequenceGroup`` ``sg`` (``cp``: diffusers'
    ``ContextParallelConfig`` on its ranks, ``models.sequence_parallel.context_parallel_config``)."""
    from diffusers.hooks.context_parallel import apply_context_parallel

    if getattr(transformer.config, "image_condition_type", None) == "token_replace":
        raise ValueError("train.sequence_parallel: HunyuanVideo's token-replace (image-to-video) transformer is not "
                         "supported (its first-frame tokens are numbered over the whole sequence)")
    apply_context_parallel(transformer, cp, plan())
    for blocks in (transformer.transformer_blocks, transformer.single_transformer_blocks):
        for block in blocks:
            block.attn.set_processor(UlyssesJointAttnProcessor(sg.group))


class UlyssesJointAttnProcessor:
    """``HunyuanVideoAttnProcessor2_0`` with the image tokens split over ``group`` (see the module doc)."""

    def __init__(self, group):
        self.group = group

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        from diffusers.models.attention_dispatch import dispatch_attention_fn
        from diffusers.models.embeddings import apply_rotary_emb

        if encoder_hidden_states is None:  # (HunyuanVideo's joint blocks always pass the text)
            raise ValueError("UlyssesJointAttnProcessor: the joint attention needs the text tokens")
        dual = attn.add_q_proj is not None
        q, k, v = (proj(hidden_states).unflatten(2, (attn.heads, -1)) for proj in (attn.to_q, attn.to_k, attn.to_v))
        if attn.norm_q is not None:
            q = attn.norm_q(q)
        if attn.norm_k is not None:
            k = attn.norm_k(k)
        if image_rotary_emb is not None:  # this rank's rows (the rope hook split them)
            q = apply_rotary_emb(q, image_rotary_emb, sequence_dim=1)
            k = apply_rotary_emb(k, image_rotary_emb, sequence_dim=1)
        projs = (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj) if dual else (attn.to_q, attn.to_k, attn.to_v)
        eq, ek, ev = (proj(encoder_hidden_states).unflatten(2, (attn.heads, -1)) for proj in projs)
        norm_q, norm_k = (attn.norm_added_q, attn.norm_added_k) if dual else (attn.norm_q, attn.norm_k)
        if norm_q is not None:
            eq = norm_q(eq)
        if norm_k is not None:
            ek = norm_k(ek)
        g = self.group
        S = q.shape[1] * torch.distributed.get_world_size(g)
        L = eq.shape[1]
        query, key, value = (torch.cat([seq_to_heads(a, g), head_slice(b, g)], dim=1)
                             for a, b in ((q, eq), (k, ek), (v, ev)))
        mask = attention_mask
        if mask is not None:  # [B, 1, 1, S/d + L] -> [B, 1, 1, S + L]: every image token, the text part as given
            ones = torch.ones(*mask.shape[:-1], S, dtype=mask.dtype, device=mask.device)
            mask = torch.cat([ones, mask[..., -L:]], dim=-1)
        out = dispatch_attention_fn(query, key, value, attn_mask=mask, dropout_p=0.0, is_causal=False)
        out = out.to(query.dtype)
        img = heads_to_seq(out[:, :S], g).flatten(2, 3)
        txt = gather_heads(out[:, S:], g).flatten(2, 3)
        if getattr(attn, "to_out", None) is not None:
            img = attn.to_out[1](attn.to_out[0](img))
        if getattr(attn, "to_add_out", None) is not None:
            txt = attn.to_add_out(txt)
        return img, txt
