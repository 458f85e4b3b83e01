"""``control.observed``: a cost profile from a run's spans, checked against means computed by hand."""

from __future__ import annotations

import pytest

from digenrl.control.observed import observed_profile
from digenrl.control.profile import ProfileCost
from digenrl.observe.trace import Span

T = 10


def _spans() -> list[Span]:
    g = "generator"
    return [
        Span("gen0", "generate", 0.00, 1.00, "s0 g0 x4 v0", g),
        Span("gen0", "idle", 1.00, 1.01, "", g),
        Span("gen0", "generate", 1.01, 2.21, "s0 g1 x4 v0", g),
        Span("gen0", "idle", 2.21, 4.00, "", g),  # a wait for the trainer, not a dispatch gap
        Span("trn0", "idle", 0.00, 1.20, "", "trainer"),
        Span("trn0", "train", 1.20, 1.70, "s0 g0 8 cells", "trainer"),
        Span("trn0", "idle", 1.70, 1.73, "", "trainer"),
        Span("trn0", "train", 1.73, 2.43, "s0 g1 8 cells", "trainer"),
        Span("trn0", "tag", 2.43, 3.43, "s1 g0 x2 v1", "trainer"),
        Span("trn0", "commit", 3.43, 3.63, "commit s0", "trainer"),
        Span("trn0", "publish", 3.63, 3.73, "publish v1", "trainer"),
        Span("trn0", "train", 5.00, 9.00, "s1 g0 8 cells", "trainer"),  # after ``until`` below
    ]


def test_means_of_the_spans_plus_the_dispatch_gap():
    data = observed_profile(_spans(), T, until=4.0, pools=(1, 1))
    gap = (0.01 + 0.03) / 2  # the idle gaps under 50 ms
    prof = ProfileCost.from_dict(data)
    assert prof.time("denoise", 4, "generator") == pytest.approx((1.00 + 1.20) / 2 / T)
    assert prof.time("denoise", 2, "trainer") == pytest.approx(1.0 / T)  # TAG: the trainer's own costs
    assert prof.time("train_chunk", 8, "trainer") == pytest.approx((0.5 + 0.7) / 2 + gap)
    assert prof.time("optimizer", 1, "trainer") == pytest.approx(0.2 + gap)
    assert prof.time("publish", 1, "trainer") == pytest.approx(0.1 + gap)
    for n in (1, 4):  # the gap is a constant per fragment, not per generation
        assert prof.time("reward", n, "generator") == pytest.approx(gap)
    assert data["generators"] == 1 and data["trainers"] == 1
    # without ``until`` the late 4 s chunk counts too
    whole = ProfileCost.from_dict(observed_profile(_spans(), T))
    assert whole.time("train_chunk", 8, "trainer") == pytest.approx((0.5 + 0.7 + 4.0) / 3 + gap)


def test_a_pool_that_did_not_generate_gets_the_other_pools_costs():
    spans = [s for s in _spans() if s.kind != "tag"]
    prof = ProfileCost.from_dict(observed_profile(spans, T, until=4.0))
    assert prof.time("denoise", 4, "trainer") == pytest.approx(prof.time("denoise", 4, "generator"))


def test_spans_without_training_are_refused():
    with pytest.raises(ValueError, match="up to 1.5 s have no train_chunk, commit action"):
        observed_profile(_spans(), T, until=1.5)
