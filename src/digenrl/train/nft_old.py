"""DiffusionNFT's old policy (``train.nft_old_policy``): the weights that sample and that give v_old in the loss.

``soft`` (the reference's default, its ``config.decay_type = 1``): a copy of the trainable parameters, set to
theta before the first step and, after the last optimizer step of every training step (the reference: at the end
of each epoch, after its gradient steps), softly moved towards the live weights::

    d_n  = 0                                   if n < flat
         = min(rate (n - flat), cap)           otherwise
    old <- d_n old + (1 - d_n) theta

with n the optimizer steps taken so far (the reference's ``global_step`` after the epoch, so every commit
counts, ``train.minibatches_per_step`` x ``inner_epochs`` per step) and (flat, rate, cap) =
``train.nft_old_decay``: (0, 0.001, 0.5) is the reference's decay type 1, (75, 0.0075, 0.999) its type 2
(``sd3_ocr``), (0, 0, 0) its type 0 (old = the step's starting weights for the whole step). The generators
sample with ``old`` (the reference sets the ``old`` adapter before ``pipeline_with_logprob``: the published
version k is old_k), and each DiffusionNFT cell gets v_old from a no-grad forward with ``old`` swapped in
(``swapped``). Eval and checkpoints use the live weights (or their EMA), as the reference's eval uses ``default``.

``current``: no copy; old is the live weights (v_old = v detached from the same forward, ``algo.nft``), so the
paper's beta cancels from the gradient. It equals ``soft`` with (0, 0, 0) when a step has one optimizer step.

The copy (``train.ema.ParamCopy``) shadows only trainable tensors (the LoRA adapters under LoRA, the local shards
under FSDP: built after ``train.sharding.shard_context`` shards the policy, like the EMA).

Source: NVlabs/DiffusionNFT@24af555 ``scripts/train_nft_sd3.py`` (``return_decay``; the copy of the trainable
into the old parameters before the epoch loop; ``set_adapter("old")`` around sampling and the
``old_prediction``; the soft update after each epoch), ``config/nft.py`` (``config.decay_type = 1``).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from digenrl.train.ema import ParamCopy

ATTR = "nft_old"  # the policy's attribute holding its OldPolicy (soft only)


def old_decay(n: int, flat: int, rate: float, cap: float) -> float:
    """d_n = 0 for n < flat, else min(rate (n - flat), cap) (module docstring)."""
    if n < flat:
        return 0.0
    return min((n - flat) * rate, cap)


class OldPolicy(ParamCopy):
    """The soft-updated copy of ``module``'s trainable parameters (module docstring)."""

    def __init__(self, module: torch.nn.Module, decay: tuple[int, float, float]):
        flat, rate, cap = decay
        if flat < 0 or rate < 0 or not 0.0 <= cap < 1.0:
            raise ValueError(f"train.nft_old_decay: (flat >= 0, rate >= 0, 0 <= cap < 1), got {tuple(decay)}")
        self.decay = (int(flat), float(rate), float(cap))
        self.commits = 0  # optimizer steps seen (the reference's global_step)
        super().__init__(module)

    @torch.no_grad()
    def commit(self, final: bool) -> None:
        """Call after every optimizer step; ``final``: the step's last one, after which old moves (d_n)."""
        self.commits += 1
        if not final:
            return
        d = old_decay(self.commits, *self.decay)
        for name, p in self.params.items():
            self.shadow[name].mul_(d).add_(p.detach(), alpha=1.0 - d)

    def state(self) -> tuple[dict[str, torch.Tensor], int]:
        return dict(self.shadow), self.commits

    @torch.no_grad()
    def load(self, shadow: dict[str, torch.Tensor], commits: int) -> None:
        if set(shadow) != set(self.shadow):
            raise ValueError(f"checkpoint's DiffusionNFT old policy has other tensors than the model's trainable "
                             f"ones (e.g. {sorted(set(shadow) ^ set(self.shadow))[:3]})")
        for k, v in shadow.items():
            self.shadow[k].copy_(v)
        self.commits = int(commits)


def attach(policy: torch.nn.Module, train_cfg) -> OldPolicy | None:
    """Give ``policy`` its old copy (``train.algorithm=nft`` with ``nft_old_policy=soft``), else remove any."""
    old = None
    if train_cfg.algorithm == "nft" and train_cfg.nft_old_policy == "soft":
        old = OldPolicy(policy, tuple(train_cfg.nft_old_decay))
    policy.__dict__[ATTR] = old
    return old


def old_of(policy) -> OldPolicy | None:
    """The policy's old copy (None: ``current``, or not DiffusionNFT)."""
    return getattr(policy, ATTR, None)


def sampling_weights(policy):
    """Context in which ``policy`` holds the weights the step samples with (old under ``soft``)."""
    old = old_of(policy)
    return old.swapped() if old is not None else nullcontext()


def after_commit(policy, final: bool) -> None:
    """The commit's bookkeeping of the old copy (none under ``current``)."""
    old = old_of(policy)
    if old is not None:
        old.commit(final)
