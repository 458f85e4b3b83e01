"""Which log-prob a cell's ratio is taken against (``train.old_logprob``), the truncated importance weight of the
generator's distribution (``train.tis_cap``) and the generator-trainer mismatch metrics (why, and what each costs:
docs/fast_generator.md).

For a trained cell (generation i, trained step t) of step k, three log-probs of the same transition x -> x'::

    logp_gen    what the generator recorded when it sampled it (behaviour version v_i; its own numerics:
                ``generator.dtype``, ``generator.merge_lora``, ``generator.compile``)
    logp_start  the trainer's, under the step's starting weights theta_k
    logp        the trainer's, under its current weights (with gradient)

``train.old_logprob``: ``generator`` (the default, Flow-GRPO's convention): logp_old = logp_gen; ``recompute``
(verl's recomputed old log-prob): logp_old = logp_start, in the step's first round the training forward's own
log-prob, detached, in a later round one extra no-grad forward with ``StepStart`` swapped in, before the
training forward. A stale TCSS sample (v_i = k - 1) gets logp_start under theta_k as well, not its behaviour
version's (decoupled PPO's proximal policy; the TIS weight covers the staleness too).

``train.tis_cap`` = C (recompute only; verl's truncated importance sampling), per cell::

    w      = min(exp(logp_start - logp_gen), C)                  (detached)
    L_cell = w * max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)) + beta KL,    r = exp(logp - logp_start)

Mismatch metrics (every step, every mode; ``CellStats``), over the first round's trained cells of on-policy
samples (v_i = k: logp_start is the training forward's own, so the metric costs no forward), with
d = logp_gen - logp_start::

    mismatch/approx_kl     = 0.5 mean(d^2)      (Flow-GRPO's approx-KL form, as its approx_kl metric)
    mismatch/max_abs_logp  = max |d|
    mismatch/clipfrac      = mean(r0 < 1 - eps_low or r0 > 1 + eps_high),   r0 = exp(-d)
    mismatch/cells         = the number of cells measured

Stale samples and cells not forwarded (zero-advantage filter, masks) are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from digenrl.train.ema import ParamCopy

ATTR = "step_start"  # the policy's attribute holding its StepStart (recompute with several rounds per step)


@dataclass
class Mismatch:
    """Sums over the measured cells (``CellStats`` adds them up: sums, and the max)."""

    cells: int = 0
    sq: float = 0.0       # sum of 0.5 d^2
    max_abs: float = 0.0
    clipped: float = 0.0


def mismatch(logp_gen: torch.Tensor, logp_start: torch.Tensor, measured: torch.Tensor, low: float,
             high: float) -> Mismatch:
    """The mismatch sums (module docstring) of the cells where ``measured``."""
    if not bool(measured.any()):
        return Mismatch()
    d = (logp_gen.detach() - logp_start.detach())[measured].double()
    r0 = torch.exp(-d)
    return Mismatch(cells=int(d.numel()), sq=float((0.5 * d ** 2).sum()), max_abs=float(d.abs().max()),
                    clipped=float(((r0 < 1.0 - low) | (r0 > 1.0 + high)).sum()))


def tis_weight(logp_start: torch.Tensor, logp_gen: torch.Tensor, cap: float) -> torch.Tensor:
    """w = min(exp(logp_start - logp_gen), cap), detached (module docstring)."""
    return torch.exp(logp_start.detach() - logp_gen.detach()).clamp(max=cap)


class StepStart(ParamCopy):
    """The trainable parameters of the step's starting weights theta_k, kept while the step's later rounds train
    (``recompute`` with ``train.minibatches_per_step`` x ``train.inner_epochs`` > 1); ``sync(k)`` copies the live
    weights in at the start of step k. ``version`` is the step it holds; a later round checks it (``check``)."""

    def __init__(self, module: torch.nn.Module, version: int):
        super().__init__(module)
        self.version = version

    @torch.no_grad()
    def sync(self, version: int, force: bool = False) -> None:
        if version == self.version and not force:
            return
        for name, p in self.params.items():
            self.shadow[name].copy_(p.detach())
        self.version = version

    def check(self, version: int) -> None:
        if self.version != version:
            raise RuntimeError(f"train.old_logprob=recompute: the step-start snapshot holds the weights of step "
                               f"{self.version}, not of step {version}")


def attach(policy: torch.nn.Module, train_cfg, version: int = 0) -> StepStart | None:
    """Give ``policy`` its step-start snapshot where a step has later rounds under ``recompute``, else none."""
    snap = None
    if train_cfg.old_logprob == "recompute" and train_cfg.minibatches_per_step * train_cfg.inner_epochs > 1:
        snap = StepStart(policy, version)
    policy.__dict__[ATTR] = snap
    return snap


def step_start_of(policy) -> StepStart | None:
    return getattr(policy, ATTR, None)


def sync_step_start(policy, version: int, force: bool = False) -> None:
    """At the start of step ``version`` (a final commit, a restore, the step's first round): the snapshot takes the
    live weights unless it holds that step already (``force``: always); nothing without a snapshot."""
    snap = step_start_of(policy)
    if snap is not None:
        snap.sync(version, force)
