"""The pure math of deferred step-wide advantages (``algo.deferred_std``): the provisional terms combined with the
commit's coefficients hold the reference's unclipped advantages, and the correction flags mark exactly the
samples where the held value is not the final advantage. (The gradient itself: tests/train/test_deferred_round.py.)"""

from __future__ import annotations

import pytest
import torch

from digenrl.algo.advantage import group_advantages
from digenrl.algo.deferred_std import (AdvOptions, corrections, head_coefficients, implied, provisional_terms,
                                       step_scale)

REWARDS = torch.tensor([[0.5, 0.5, 0.5, 0.5], [0.0, 0.25, 0.5, 0.25], [0.75, 1.0, 0.5, 0.75]], dtype=torch.float64)


def _reference(opts: AdvOptions, clip: float):
    ids = torch.arange(3).repeat_interleave(4)
    a, _ = group_advantages(REWARDS.flatten(), ids, std_mode=opts.std_mode, baseline=opts.baseline, eps=opts.eps,
                            adv_clip_max=clip, unbiased=opts.unbiased)
    return a.reshape(3, 4)


@pytest.mark.parametrize("std_mode,baseline", [("global", "group"), ("group", "batch"), ("global", "batch")])
@pytest.mark.parametrize("b0", [0.25, 0.6])
def test_held_advantages_are_the_reference_unclipped_ones(std_mode, baseline, b0):
    opts = AdvOptions(std_mode, baseline, clip=0.8)
    lam, mean = step_scale(REWARDS.flatten(), opts)
    coef = head_coefficients(opts, lam, mean, b0)
    final, unclipped = _reference(opts, 0.8), _reference(opts, float("inf"))
    flags = []
    for g in range(3):
        terms = provisional_terms(REWARDS[g], opts, b0, spread=1.0)
        if not terms.late:
            torch.testing.assert_close(implied(terms, coef), unclipped[g].double(), rtol=1e-6, atol=1e-6)
        c = corrections(terms, final[g], unclipped[g], coef, opts)
        clipped = final[g] != unclipped[g]
        assert torch.equal(c.whole, clipped | (c.kl != 0))
        assert torch.equal(c.held[~c.whole], c.final[~c.whole])  # no correction coefficient where none is due
        flags.append(c)
    assert any(bool(c.whole.any()) for c in flags)
    if baseline == "batch":  # a tie of the step's mean (0.5) counts as zero at the end: its KL is removed
        assert all(bool((c.kl[REWARDS[g] == 0.5] == -1).all()) for g, c in enumerate(flags) if not
                   provisional_terms(REWARDS[g], opts, b0, 1.0).late)
    else:  # with the group baseline a zero stays zero at every scale: nothing to remove
        assert all(bool((c.kl == 0).all()) for c in flags)


def test_zero_advantages_are_filtered_provisionally_only_with_the_group_baseline():
    tie = REWARDS[0]
    assert not provisional_terms(tie, AdvOptions("global", "group")).keep.any()
    assert provisional_terms(tie, AdvOptions("global", "batch"), b0=0.3).keep.all()
    assert provisional_terms(tie, AdvOptions("global", "group", filter_zero=False)).keep.all()


def test_a_tied_group_with_group_std_and_batch_baseline_is_late():
    """w_g = 1 / eps for a tie: its coefficients would cancel in float32, so it trains at the commit."""
    opts = AdvOptions("group", "batch", clip=5.0)
    t = provisional_terms(REWARDS[0], opts, b0=0.25, spread=1.0)
    assert t.late and not t.keep.any()
    assert not provisional_terms(REWARDS[1], opts, b0=0.25, spread=1.0).late
