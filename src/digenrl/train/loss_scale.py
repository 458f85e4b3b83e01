"""The normalisation of a round's gradient, in one place: every trainer rank (in-process or on Ray, replicated or
FSDP) takes it from here; the controller only moves the rewards (plain numbers) to the trainers.

For a round (one commit) over the groups of a minibatch, with S trained timesteps::

    grad = (1 / kept) sum_{cells of kept samples} grad (1 / S) [ max(-A r, -A clip(r)) + beta KL ]

``LossScale.cell`` is the factor of every cell at its backward (1 / S, times the rank weight of a sharded pool:
0 for the throw-away cell of a rank with no share, ``sharding.rank_cells``); ``LossScale.commit`` the factor at
the commit (1 / kept, the round's trajectories that count in the mean: all of them, or those with a non-zero
advantage under ``train.filter_zero_advantage``). The final advantages come from ``step_advantages``: the
rewards of the step's complete groups (group index -> rewards in generation order, as the controller collects
them) normalised as one batch of the step (``step_math.assign_advantages``).

Step-wide statistics (``train.std_mode=global``, ``train.adv_baseline=batch``) in a pipelined mode: a round
that starts before every reward of its step is in is trained by a ``DeferredRound`` with provisional terms
and separate gradient accumulators, combined at the commit with the step's scale, plus a correction pass
(the formulas are in ``algo.deferred_std``). DiffusionNFT's cell loss is affine in A, ``A l + m``
(``algo.nft.linear_parts``): l is both branches (none leaves a clip interval) and m an A-free term trained
like the KL, so the same heads and corrections make it exact too.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Iterable, Mapping, Sequence

import torch

from digenrl.algo.deferred_std import (AdvOptions, GroupTerms, corrections, head_coefficients, provisional_terms,
                                       sign, step_scale)
from digenrl.algo.loss import clipped_policy_loss
from digenrl.train.chunk_loss import CellStats, LossSettings, cell_forward, cell_rows, nft_cell_terms
from digenrl.train.step_math import adv_options, assign_advantages, kept_cells, kept_count

Rewards = Mapping[int, Sequence[float]]            # group index -> rewards, in generation order
Parts = Mapping[int, Mapping[str, Sequence[float]]]  # group index -> reward part -> values


@dataclass(frozen=True)
class LossScale:
    """The loss scale of one round (module docstring)."""

    num_trained: int   # S
    kept: int = 0      # trajectories of the round that count in the mean (0 while not known yet)

    def cell(self, weight: float = 1.0) -> float:
        """The factor of each cell's loss at its backward."""
        return weight / self.num_trained

    @property
    def commit(self) -> float:
        """The factor of the accumulated gradient at the commit."""
        return 1.0 / max(self.kept, 1)


def loss_scale(num_trained: int, advantages: Iterable[torch.Tensor] = (), filter_zero: bool = True,
               keep: Iterable[torch.Tensor | None] | None = None) -> LossScale:
    """The loss scale of a round whose groups have the (final) ``advantages``; ``keep``: their kept masks where
    set (``train.zero_adv_refill``: the re-added zero-advantage samples count too)."""
    advantages = list(advantages)
    keep = [None] * len(advantages) if keep is None else list(keep)
    return LossScale(num_trained, sum(kept_count(a, filter_zero, k) for a, k in zip(advantages, keep, strict=True)))


def step_advantages(rewards: Rewards, train_cfg, parts: Parts | None = None, *,
                    clip: float | None = None) -> dict[int, torch.Tensor]:
    """The advantages of the complete groups in ``rewards`` (group -> [G] or [G, K] per reward part), computed
    over the groups as one batch (in index order); ``clip`` overrides
    ``train.adv_clip_max`` (``inf``: the unclipped values). Step-wide statistics need every group of the step
    in ``rewards``."""
    groups = sorted(rewards)
    r = torch.tensor([float(x) for g in groups for x in rewards[g]], dtype=torch.float64)
    ids = torch.tensor([g for g in groups for _ in rewards[g]], dtype=torch.long)
    # the parts in the order the reward reported them (the config's order, that of ``LossSettings.adv_weights``
    # and of the sampled batch's ``reward_parts``), not sorted by name
    names = list(dict.fromkeys(k for g in groups for k in (parts or {}).get(g, {})))
    batch = SimpleNamespace(rewards=r, uids=ids, reward_parts={
        k: torch.tensor([float(x) for g in groups for x in parts[g][k]], dtype=torch.float64) for k in names})
    opts = adv_options(train_cfg)
    assign_advantages(batch, opts if clip is None else replace(opts, clip=clip))
    return dict(zip(groups, batch.advantages.split([len(rewards[g]) for g in groups])))


def _branch(log_prob, old_logp, s: torch.Tensor, settings: LossSettings) -> torch.Tensor:
    """ℓ^s per cell: the clipped loss per unit advantage on branch s (+-1): s max(-s r, -s clip(r))."""
    loss, _ = clipped_policy_loss(log_prob, old_logp, s, settings.clip_range, clip_low=settings.clip_low,
                                  clip_high=settings.clip_high)
    return s * loss


@dataclass
class _Sums:
    """Detached per-sample sums over the cells a rank trained (the commit's loss statistics)."""

    cells: int = 0
    plus: float = 0.0    # sum of ℓ^+
    minus: float = 0.0   # sum of ℓ^-
    kl: float = 0.0
    approx_kl: float = 0.0
    clipfrac: float = 0.0
    gt: float = 0.0
    lt: float = 0.0
    const: float = 0.0   # sum of the A-free term (beta KL; DiffusionNFT's m + beta KL)


@dataclass
class DeferredRound:
    """A round trained before its step's rewards are all in (``algo.deferred_std``).

    ``known``: the step's rewards known when the round starts on this rank (``b0`` = their mean, the provisional
    baseline of ``adv_baseline=batch``). ``train`` accumulates a chunk into the heads; ``finish`` (at the commit,
    every reward in) leaves the combined gradient, correction included, in the parameters' ``.grad`` and
    returns the rank's loss statistics with the final advantages. On a sharded pool both are collectives of
    the shard group: its ranks get the same calls with the same arguments, so they take the same decisions and
    run the same forwards and backwards (``finish`` agrees on the number of correction forwards first)."""

    opts: AdvOptions
    settings: LossSettings
    params: list
    known: Rewards
    b0: float = 0.0
    spread: tuple[float, float] = (float("inf"), float("-inf"))  # min, max of the known rewards
    heads: dict = field(default_factory=dict)       # head name -> [grad per parameter]
    terms: dict = field(default_factory=dict)       # group -> GroupTerms
    trained: dict = field(default_factory=dict)     # group -> [(generation, trained position)] trained here
    late: dict = field(default_factory=dict)        # group -> cells of a late group assigned here (trained at commit)
    outside: set = field(default_factory=set)       # (group, generation, position): ratio left the clip interval
    sums: dict = field(default_factory=dict)        # (group, generation) -> _Sums
    step_start: bool = True  # the round is its step's first (train.old_logprob: logp_start and the mismatch free)
    mismatch: dict = field(default_factory=dict)    # group -> CellStats of the forwarded cells' mismatch sums

    def __post_init__(self):
        known = [float(x) for g in sorted(self.known) for x in self.known[g]]
        if known:
            self.spread = (min(known), max(known))
        if self.opts.baseline == "batch" and known:
            self.b0 = float(torch.tensor(known, dtype=torch.float64).mean())

    @property
    def head_names(self) -> tuple[str, ...]:
        """"p" (x Λ at the commit; with std_mode=group Λ = 1 and it holds the KL too), "q" (batch baseline,
        x Λ (b0 - m_B)), "kl" (std_mode=global and beta > 0, x 1): the same on every rank."""
        names = ["p"]
        if self.opts.baseline == "batch":
            names.append("q")
        if self.opts.std_mode == "global" and self._has_const:
            names.append("kl")
        return tuple(names)

    @property
    def _has_const(self) -> bool:
        """Whether the cell loss has an A-free term (the KL; DiffusionNFT's m always)."""
        return self.settings.beta_kl > 0 or self.settings.algorithm == "nft"

    def _cell_terms(self, policy, batch, cells, ref_policy):
        """(``at``: a per-sample float64 tensor at the cells, on the loss's device and dtype; ℓ^s as a function of
        the branch s; the A-free term per cell; a recorder of the cells' statistics) of one packed forward of
        ``cells``: Flow-GRPO's clipped ratio with beta KL, or DiffusionNFT's L = A ℓ + m (module docstring)."""
        st, (rows, tpos) = self.settings, cell_rows(batch, cells)
        gen = torch.tensor([g for g, _ in cells], dtype=torch.long)
        if st.algorithm == "nft":
            ell, const, kl = nft_cell_terms(policy, batch, rows, tpos, settings=st, ref_policy=ref_policy)
            return ((lambda v: v[gen].to(const.device, const.dtype)), (lambda s: ell), const,
                    (lambda group, cells: self._record_nft(group, cells, ell.detach(), const.detach(), kl.detach())))
        f = cell_forward(policy, batch, rows, tpos, settings=st, ref_policy=ref_policy, step_start=self.step_start)
        log_prob, old_logp, kl, w = f.out.log_prob, f.old_logp, f.kl, f.tis  # (w: train.tis_cap, fixed per cell)
        const = st.beta_kl * kl
        return ((lambda v: v[gen].to(const.device, const.dtype)),
                (lambda s: _branch(log_prob, old_logp, s, st) * (1.0 if w is None else w)), const,
                (lambda group, cells: self._record(group, cells, log_prob.detach(), old_logp.detach(), kl.detach(),
                                                   w, f.mismatch)))

    def group_terms(self, group: int, rewards: Sequence[float]) -> GroupTerms:
        if group not in self.terms:
            r = [float(x) for x in rewards]
            spread = max(self.spread[1], *r) - min(self.spread[0], *r)
            self.terms[group] = provisional_terms(torch.tensor(r, dtype=torch.float64), self.opts, self.b0, spread)
        return self.terms[group]

    def train(self, policy, batch, group: int, rewards: Sequence[float], cells: Sequence[tuple[int, int]], *,
              loss_scale: float, ref_policy=None, collective: bool = False) -> CellStats:
        """Accumulate ``cells`` (generation, trained position) of ``group`` (``batch``, its rewards in generation
        order) into the heads; ``loss_scale`` 0: a rank's throw-away share of a collective chunk. The loss
        statistics come with the commit (``finish``)."""
        terms = self.group_terms(group, rewards)
        if terms.late:  # trained in the correction pass (on every rank of a shard group alike)
            if loss_scale > 0:
                self.late.setdefault(group, []).extend(cells)
            return CellStats(cells=len(cells))
        mine, weight = kept_cells(cells, [bool(terms.keep[g]) for g, _ in cells], collective)
        if not mine:
            return CellStats(cells=len(cells))
        scale = loss_scale * weight
        self._accumulate(policy, batch, group, mine, scale, ref_policy, record=scale > 0)
        return CellStats(cells=len(cells))

    def _accumulate(self, policy, batch, group, cells, scale, ref_policy, record) -> None:
        terms = self.terms[group]
        at, branch, const, record_cells = self._cell_terms(policy, batch, cells, ref_policy)
        loss = branch(at(terms.sign))
        losses = {"p": (at(terms.p) * loss).sum()}
        if terms.q is not None:
            losses["q"] = (at(terms.q) * loss).sum()
        if self._has_const:
            k = "kl" if "kl" in self.head_names else "p"
            losses[k] = losses.get(k, 0.0) + const.sum()
        self._backward({n: losses[n] * scale for n in self.head_names})
        if record:
            self.trained.setdefault(group, []).extend(cells)
            record_cells(group, cells)

    def _backward(self, losses: dict) -> None:
        """One backward per head into its own accumulator (the parameters' ``.grad`` swapped in and out)."""
        names = list(losses)
        for i, n in enumerate(names):
            acc = self.heads.get(n) or [None] * len(self.params)
            for p, g in zip(self.params, acc):
                p.grad = g
            losses[n].backward(retain_graph=i < len(names) - 1)
            self.heads[n] = [p.grad for p in self.params]
        for p in self.params:
            p.grad = None

    def _record(self, group, cells, log_prob, old_logp, kl, tis=None, mismatch=None) -> None:
        """Per-sample sums of the cells' loss terms (both branches, times the TIS weight ``tis`` where set), KL and
        ratio statistics; the cells whose ratio left the clip interval (there the two branches differ); the
        forwarded cells' mismatch sums, per group (whatever their final advantage)."""
        st = self.settings
        lo, hi = st.clip_bounds
        log_ratio = log_prob - old_logp
        ratio = torch.exp(log_ratio)
        w = torch.ones_like(ratio) if tis is None else tis
        plus = (-torch.minimum(ratio, ratio.clamp(1 - lo, 1 + hi)) * w).tolist()
        minus = (-torch.maximum(ratio, ratio.clamp(1 - lo, 1 + hi)) * w).tolist()
        out = ((ratio < 1 - lo) | (ratio > 1 + hi)).tolist()
        if mismatch is not None:
            self.mismatch[group] = self.mismatch.get(group, CellStats()).with_mismatch(mismatch)
        for j, ((g, t), r, lr, k) in enumerate(zip(cells, ratio.tolist(), log_ratio.tolist(), kl.tolist())):
            if out[j]:
                self.outside.add((group, g, t))
            s = self.sums.setdefault((group, g), _Sums())
            s.cells += 1
            s.plus += plus[j]
            s.minus += minus[j]
            s.kl += k
            s.approx_kl += 0.5 * lr ** 2
            s.clipfrac += float(abs(r - 1.0) > st.clip_range)
            s.gt += float(r - 1.0 > hi)
            s.lt += float(1.0 - r > lo)
            s.const += st.beta_kl * k

    def _record_nft(self, group, cells, ell, const, kl) -> None:
        """DiffusionNFT's per-sample sums: ℓ on both branches, the A-free term and the KL (no ratio)."""
        for (g, t), e, m, k in zip(cells, ell.tolist(), const.tolist(), kl.tolist()):
            s = self.sums.setdefault((group, g), _Sums())
            s.cells += 1
            s.plus += e
            s.minus += e
            s.kl += k
            s.const += m

    def finish(self, policy, batches: Mapping[int, object], rewards: Rewards, train_cfg, *, loss_scale: float,
               ref_policy=None, collective: bool = False, process_group=None, piece: int = 64) -> CellStats:
        """At the commit: combine the heads into ``.grad`` with the step's scale, run the correction pass (at most
        ``piece`` cells per forward) and return the loss statistics of the cells this rank trained."""
        groups = sorted(rewards)
        lam, mean = step_scale(torch.tensor([float(x) for g in groups for x in rewards[g]], dtype=torch.float64),
                               self.opts)
        coef = {"kl": 1.0, **head_coefficients(self.opts, lam, mean, self.b0)}
        self._combine(coef)
        final = step_advantages(rewards, train_cfg)
        unclipped = step_advantages(rewards, train_cfg, clip=float("inf"))
        todo, corr = {}, {}
        for g in sorted(self.terms):
            c = corr[g] = corrections(self.terms[g], final[g], unclipped[g], coef, self.opts)
            todo[g] = [(i, t) for i, t in self.trained.get(g, []) + self.late.get(g, [])
                       if c.whole[i] or (c.flipped[i] and (g, i, t) in self.outside)]
        counts = torch.tensor([len(todo[g]) for g in sorted(todo)], dtype=torch.long)
        if collective and len(counts):
            import torch.distributed as dist

            dist.all_reduce(counts, op=dist.ReduceOp.MAX, group=process_group)
        for n, g in zip(counts.tolist(), sorted(todo)):
            for k in range(-(-n // piece)):
                cells = todo[g][k * piece:(k + 1) * piece]
                weight = 1.0
                if not cells:  # a rank with fewer corrected cells joins the collective forward with weight 0
                    cells, weight = [(int(batches[g].gen_index[0]), 0)], 0.0
                self._correct(policy, batches[g], g, corr[g], cells, loss_scale * weight, ref_policy)
        stats = CellStats()
        for g in sorted(self.terms):
            stats = stats.add(self._stats(g, corr[g]))
        return stats

    def _combine(self, coef: dict) -> None:
        for i, p in enumerate(self.params):
            total = None
            for n, acc in self.heads.items():
                if acc[i] is not None:
                    total = acc[i] * coef[n] if total is None else total + acc[i] * coef[n]
            p.grad = total
        self.heads = {}

    def _correct(self, policy, batch, group: int, c, cells, scale, ref_policy) -> None:
        """grad scale sum_cells [A ℓ^σ(A) - Ã ℓ^σ_i + beta (k - κ) KL], added to ``.grad``; a late group's cells
        are recorded for the statistics here."""
        terms = self.terms[group]
        at, branch, const, record_cells = self._cell_terms(policy, batch, cells, ref_policy)
        loss = at(c.final) * branch(at(sign(c.final))) - at(c.held) * branch(at(terms.sign)) + at(c.kl) * const
        (loss.sum() * scale).backward()
        if terms.late and scale > 0:
            record_cells(group, cells)

    def _stats(self, group: int, c) -> CellStats:
        """The rank's loss statistics of ``group`` with the final advantages (its samples that count), and the
        mismatch sums of the cells it forwarded."""
        out = self.mismatch.get(group, CellStats())
        for (g, i), s in self.sums.items():
            if g != group or (self.opts.filter_zero and c.final[i] == 0):
                continue
            a = float(c.final[i])
            out = out.add(CellStats(loss=a * (s.plus if a >= 0 else s.minus) + s.const,
                                    approx_kl=s.approx_kl, clipfrac=s.clipfrac, kl=s.kl, clipfrac_gt_one=s.gt,
                                    clipfrac_lt_one=s.lt, trained=s.cells))
        return out
