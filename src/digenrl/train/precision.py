"""Mixed precision of the trainer (``train.mixed_precision``) and activation recomputation
(``train.activation_checkpointing``).

``bf16`` / ``fp16``: the trainable parameters are fp32 *master weights* (the optimizer state follows them);
the policy's forward runs under ``torch.autocast(dtype)``, so matmuls compute in 16 bits from 16-bit casts of
the masters while reductions and norms stay fp32. With recomputation the autocast weight cache is off (a
block's casts are redone when it is recomputed, instead of holding a 16-bit copy of every weight).

``fp16`` adds dynamic loss scaling (the rule of ``torch.amp.GradScaler``; Micikevicius et al. 2018), fitted to
the chunked gradient transaction: the velocity's gradient is multiplied by the scale S on its way into the
transformer (``ScaleGrad``: identity forward, backward g -> S g), so every chunk's fp16 backward runs on
S-times larger numbers and the accumulated parameter gradients are S times the true ones. At the commit, after
the all-reduce::

    g <- g / S;   finite = all(isfinite(g)) over every rank
    finite:  clip + optimizer step;  after ``growth_interval`` finite commits in a row, S <- 2 S
    else:    the step's update is skipped (no optimizer step), S <- S / 2

so no chunk ever sees a different S than another chunk of the same step (S changes only at commits).
``update`` is ``torch._amp_update_scale_``'s rule; ``GradScaler`` itself does not fit: its ``scale`` multiplies a
value (not a gradient inside the model), its finite flag is private and not agreed over the transaction's group
(an FSDP rank holds a shard of the gradient), and the commit clips between unscale and step.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class ScaleGrad(torch.autograd.Function):
    """Identity in the forward pass; multiplies the incoming gradient by ``scale`` in the backward pass."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        return g * ctx.scale, None


@dataclass
class Precision:
    """What a policy's forward and the transaction's commit need to know about precision."""

    mode: str = "none"  # none | bf16 | fp16
    device_type: str = "cpu"
    cache_enabled: bool = True
    scale: float = 1.0  # fp16: the current loss scale S
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    _good_steps: int = 0
    skipped: int = 0  # commits whose update was dropped (non-finite gradients)

    def state_dict(self) -> dict:
        """fp16's dynamic loss scale as a checkpoint keeps it: S, the good commits since S last changed, the skips."""
        return {"scale": self.scale, "good_steps": self._good_steps, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self._good_steps, self.skipped = float(state["scale"]), int(state["good_steps"]), int(state["skipped"])

    @property
    def dtype(self) -> torch.dtype | None:
        return DTYPES.get(self.mode)

    def autocast(self):
        if self.mode == "none":
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype, cache_enabled=self.cache_enabled)

    def scale_output(self, out: torch.Tensor) -> torch.Tensor:
        """The model output with its gradient scaled by S (fp16 only; a no-op without grad)."""
        if self.mode != "fp16" or not out.requires_grad:
            return out
        return ScaleGrad.apply(out, self.scale)

    @torch.no_grad()
    def unscale_and_check(self, params, process_group=None) -> bool:
        """Divide every gradient by S; True when all are finite on every rank (fp16), else False."""
        if self.mode != "fp16":
            return True
        bad = torch.zeros(())
        for p in params:
            if p.grad is None:
                continue
            p.grad.mul_(1.0 / self.scale)
            g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            bad = torch.maximum(bad, (~torch.isfinite(g)).any().float().cpu())
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size(process_group) > 1:
            dist.all_reduce(bad, op=dist.ReduceOp.MAX, group=process_group)
        return not bool(bad)

    def update(self, finite: bool) -> None:
        if self.mode != "fp16":
            return
        if finite:
            self._good_steps += 1
            if self._good_steps >= self.growth_interval:
                self.scale *= self.growth_factor
                self._good_steps = 0
        else:
            self.scale *= self.backoff_factor
            self._good_steps = 0
            self.skipped += 1


def prepare_policy(policy, cfg) -> Precision:
    """Apply ``train.mixed_precision`` and ``train.activation_checkpointing`` to ``policy`` (before its optimizer
    is built) and drop a full fine-tuning reference copy nobody needs (``train.beta_kl = 0``)."""
    t = cfg.train
    try:
        device_type = next(policy.parameters()).device.type
    except StopIteration:
        device_type = "cpu"
    prec = Precision(t.mixed_precision, device_type=device_type, cache_enabled=not t.activation_checkpointing,
                     scale=cfg.tuning.loss_scale_init if t.mixed_precision == "fp16" else 1.0)
    if t.mixed_precision != "none":
        with torch.no_grad():
            for p in policy.parameters():
                if p.requires_grad and p.dtype != torch.float32:
                    p.data = p.data.float()  # fp32 master weights
    policy.precision = prec
    if t.activation_checkpointing:
        enable = getattr(policy, "enable_activation_checkpointing", None)
        if enable is None:
            raise ValueError(f"train.activation_checkpointing: model.kind={cfg.model.kind!r} does not support it")
        enable()
    if t.beta_kl == 0 and getattr(policy, "_reference_snapshot", None) is not None:
        policy._reference_snapshot = None  # no KL term: no reference copy of the weights
    return prec
