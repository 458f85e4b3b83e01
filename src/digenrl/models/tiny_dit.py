"""The built-in tiny conditional flow-matching transformer (DiT with adaLN-Zero) for the digits demo.

Pixels are the latents (no VAE): x is [B, 1, 8, 16] in [-1, 1], cut into 2x2 patches -> 32 tokens. The prompt
is two slot tokens (left, right; ``tasks.digits``) embedded as two extra tokens in front of the image tokens
(in-context conditioning, like MMDiT's joint attention) and, summed with the timestep embedding, as the adaLN
condition. Output: the velocity v = eps - x_0 of the rectified flow x_sigma = (1 - sigma) x_0 + sigma eps.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from digenrl.algo.sigmas import flow_match_sigmas
from digenrl.models.base import Cond, Policy

ASSET_DIR = Path(__file__).resolve().parent.parent / "assets"
DEFAULT_BASE = ASSET_DIR / "digits_base.safetensors"


@dataclass(frozen=True)
class TinyDiTConfig:
    in_channels: int = 1
    height: int = 8
    width: int = 16
    patch: int = 2
    dim: int = 64
    depth: int = 3
    heads: int = 4
    mlp_ratio: float = 4.0
    cond_slots: int = 2
    cond_vocab: int = 12  # digits 0-9, blank (10), null (11)
    null_token: int = 11
    shift: float = 1.0


def timestep_embedding(sigma: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of t = 1000 * sigma: [cos(t w_k), sin(t w_k)], w_k = 10000^(-k / (dim/2))."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=sigma.device, dtype=torch.float32) / half)
    args = 1000.0 * sigma.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class Block(nn.Module):
    """Pre-LN transformer block with adaLN-Zero: x += g1 * Attn(LN(x)(1+s1)+b1); x += g2 * MLP(LN(x)(1+s2)+b2)."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, dim))
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        nn.init.zeros_(self.ada[1].weight)
        nn.init.zeros_(self.ada[1].bias)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        b1, s1, g1, b2, s2, g2 = self.ada(c)[:, None].chunk(6, dim=-1)
        h = self.norm1(x) * (1 + s1) + b1
        x = x + g1 * self.attn(h, h, h, need_weights=False)[0]
        h = self.norm2(x) * (1 + s2) + b2
        return x + g2 * self.mlp(h)


class TinyDiT(nn.Module):
    def __init__(self, cfg: TinyDiTConfig):
        super().__init__()
        self.cfg = cfg
        p, d = cfg.patch, cfg.dim
        self.grid = (cfg.height // p, cfg.width // p)
        n_tokens = self.grid[0] * self.grid[1]
        self.patch_in = nn.Linear(cfg.in_channels * p * p, d)
        self.pos = nn.Parameter(torch.randn(1, n_tokens, d) * 0.02)
        self.cond_emb = nn.ModuleList([nn.Embedding(cfg.cond_vocab, d) for _ in range(cfg.cond_slots)])
        self.cond_pos = nn.Parameter(torch.randn(1, cfg.cond_slots, d) * 0.02)
        self.t_mlp = nn.Sequential(nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d))
        self.blocks = nn.ModuleList([Block(d, cfg.heads, cfg.mlp_ratio) for _ in range(cfg.depth)])
        self.norm_out = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.ada_out = nn.Sequential(nn.SiLU(), nn.Linear(d, 2 * d))
        self.patch_out = nn.Linear(d, cfg.in_channels * p * p)
        for m in (self.ada_out[1], self.patch_out):
            nn.init.zeros_(m.weight)
            nn.init.zeros_(m.bias)
        self.checkpointing = False  # recompute each block in backward (activation checkpointing)

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        p = self.cfg.patch
        gh, gw = self.grid
        patches = x.reshape(B, C, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5).reshape(B, gh * gw, C * p * p)
        h = self.patch_in(patches) + self.pos
        cond_tokens = torch.stack([emb(tokens[:, i]) for i, emb in enumerate(self.cond_emb)], dim=1) + self.cond_pos
        c = self.t_mlp(timestep_embedding(sigma, self.cfg.dim).to(h.dtype)) + cond_tokens.sum(dim=1)
        h = torch.cat([cond_tokens, h], dim=1)
        for blk in self.blocks:
            if self.checkpointing and torch.is_grad_enabled():
                from torch.utils.checkpoint import checkpoint

                h = checkpoint(blk, h, c, use_reentrant=False)
            else:
                h = blk(h, c)
        h = h[:, self.cfg.cond_slots :]
        shift, scale = self.ada_out(c)[:, None].chunk(2, dim=-1)
        out = self.patch_out(self.norm_out(h) * (1 + scale) + shift)
        return out.reshape(B, gh, gw, C, p, p).permute(0, 3, 1, 4, 2, 5).reshape(B, C, H, W)


class TinyDiTPolicy(Policy):
    """Policy adapter around ``TinyDiT`` for prompts of the digits task (``meta`` has left/right tokens)."""

    def __init__(self, cfg: TinyDiTConfig | None = None):
        super().__init__()
        self.cfg = cfg or TinyDiTConfig()
        self.net = TinyDiT(self.cfg)
        self.latent_shape = (self.cfg.in_channels, self.cfg.height, self.cfg.width)

    def encode_prompts(self, prompts: Sequence) -> Cond:
        try:
            tokens = [[p.meta["left"], p.meta["right"]] for p in prompts]
        except KeyError as e:
            raise ValueError(f"tiny_dit needs digits-task prompts with meta left/right; missing {e}") from None
        return {"tokens": torch.tensor(tokens, dtype=torch.long, device=self.pos_device)}

    def null_cond(self, n: int) -> Cond:
        return {"tokens": torch.full((n, self.cfg.cond_slots), self.cfg.null_token, dtype=torch.long, device=self.pos_device)}

    @property
    def pos_device(self) -> torch.device:
        return self.net.pos.device

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond, guidance: float | None = None) -> torch.Tensor:
        with self.compute_context():  # (x in the weights' dtype: a generator's inference copy may hold bf16)
            out = self.net(x.to(self.net.pos.dtype), sigma, cond["tokens"])
        return self.scale_output(out.to(x.dtype))  # scaled in fp32, before the cast (fp16 underflow)

    def velocity_model(self) -> nn.Module:
        return self.net

    def enable_activation_checkpointing(self) -> None:
        self.net.checkpointing = True

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return ((latents.float() + 1.0) / 2.0).clamp(0.0, 1.0)

    def sigmas(self, num_steps: int) -> torch.Tensor:
        return flow_match_sigmas(num_steps, shift=self.cfg.shift)

    # --- weights --------------------------------------------------------------------------------------------
    def save(self, path: str | Path, extra_meta: dict[str, str] | None = None, state: dict | None = None) -> None:
        """``state``: the full ``state_dict`` to write (gathered first when the policy is sharded)."""
        from safetensors.torch import save_file

        meta = {"tiny_dit_config": json.dumps(asdict(self.cfg)), **(extra_meta or {})}
        state = {k: v.detach().contiguous().cpu() for k, v in (state or self.state_dict()).items()}
        save_file(state, str(path), metadata=meta)

    @classmethod
    def load(cls, path: str | Path) -> "TinyDiTPolicy":
        from safetensors import safe_open
        from safetensors.torch import load_file

        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"model.path: tiny_dit checkpoint {str(p)!r} does not exist")
        with safe_open(str(p), framework="pt") as f:
            meta = f.metadata() or {}
        if "tiny_dit_config" not in meta:
            raise ValueError(f"model.path: {str(p)!r} is not a tiny_dit checkpoint (no tiny_dit_config metadata)")
        policy = cls(TinyDiTConfig(**json.loads(meta["tiny_dit_config"])))
        policy.load_state_dict(load_file(str(p)))
        return policy


def build_tiny_dit_policy(model_cfg) -> TinyDiTPolicy:
    path = Path(model_cfg.path) if model_cfg.path else DEFAULT_BASE
    if model_cfg.lora.enabled:
        raise ValueError("model.lora.enabled: LoRA is for diffusers families; tiny_dit trains all weights")
    policy = TinyDiTPolicy.load(path)
    return policy.to(model_cfg.device)
