"""``control.observed``: a cost profile from a run's spans, checked against means computed by hand."""

from __future__ import annotations

import pytest

from digenrl.control.observed import observed_profile
from digenrl.control.profile import ProfileCost
from digenrl.observe.trace import Span
from digenrl.schedule.actions import Size

T = 10


def _spans() -> list[Span]:
    g = "generator"
    return [
        Span("gen0", "generate", 0.00, 1.00, "s0 g0 x4 v0", g, size=Size(generations=4)),
        Span("gen0", "idle", 1.00, 1.01, "", g),
        Span("gen0", "generate", 1.01, 2.21, "s0 g1 x4 v0", g, size=Size(generations=4)),
        Span("gen0", "idle", 2.21, 4.00, "", g),  # a wait for the trainer, not a dispatch gap
        Span("trn0", "idle", 0.00, 1.20, "", "trainer"),
        Span("trn0", "train", 1.20, 1.70, "s0 g0 8 cells", "trainer", size=Size(cells=8)),
        Span("trn0", "idle", 1.70, 1.73, "", "trainer"),
        Span("trn0", "train", 1.73, 2.43, "s0 g1 8 cells", "trainer", size=Size(cells=8)),
        Span("trn0", "tag", 2.43, 3.43, "s1 g0 x2 v1", "trainer", size=Size(generations=2)),
        Span("trn0", "commit", 3.43, 3.63, "commit s0", "trainer"),
        Span("trn0", "publish", 3.63, 3.73, "publish v1", "trainer"),
        Span("trn0", "train", 5.00, 9.00, "s1 g0 8 cells", "trainer", size=Size(cells=8)),  # after ``until`` below
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


def test_a_streamed_publish_without_sender_spans_prices_the_trainers_at_zero():
    """Spans on the generators alone (a stream as older runs traced it): they price ``generator/publish``; the
    trainers' part is 0."""
    spans = [s for s in _spans() if s.kind != "publish"] + [Span("gen0", "publish", 3.63, 4.13, "publish v1",
                                                                  "generator")]
    data = observed_profile(spans, T, until=4.2)
    gap = (0.01 + 0.03) / 2
    prof = ProfileCost.from_dict(data)
    assert prof.time("publish", 1, "generator") == pytest.approx(0.5 + gap)
    assert prof.time("publish", 1, "trainer") == 0.0
    assert prof.time("optimizer", 1, "trainer") == pytest.approx(0.2 + gap)


def test_a_streamed_publish_prices_the_receive_and_the_sends_apart():
    """``streamed``: the generator's span (until it holds the version) prices ``generator/publish``, the
    sender's short span (starting its sends) ``trainer/publish``."""
    spans = [s for s in _spans() if s.kind != "publish"] + [
        Span("gen0", "publish", 3.63, 4.13, "publish v1", "generator"),
        Span("trn0", "publish", 3.64, 3.67, "publish v1", "trainer")]
    gap = (0.01 + 0.03) / 2
    prof = ProfileCost.from_dict(observed_profile(spans, T, until=4.2, streamed=True))
    assert prof.time("publish", 1, "generator") == pytest.approx(0.5 + gap)
    assert prof.time("publish", 1, "trainer") == pytest.approx(0.03)
    # the same spans of a broadcast (both pools in the one collective): the trainers' span is the publish
    both = [s for s in _spans() if s.kind != "publish"] + [
        Span("gen0", "publish", 3.63, 3.93, "publish v1", "generator"),
        Span("trn0", "publish", 3.63, 3.93, "publish v1", "trainer")]
    bc = observed_profile(both, T, until=4.2)
    assert "generator/publish" not in bc["ops"]
    assert ProfileCost.from_dict(bc).time("publish", 1, "trainer") == pytest.approx(0.3 + gap)


def test_a_pool_that_did_not_generate_gets_the_other_pools_costs():
    spans = [s for s in _spans() if s.kind != "tag"]
    prof = ProfileCost.from_dict(observed_profile(spans, T, until=4.0))
    assert prof.time("denoise", 4, "trainer") == pytest.approx(prof.time("denoise", 4, "generator"))


def test_spans_without_training_are_refused():
    with pytest.raises(ValueError, match="up to 1.5 s have no train_chunk, commit action"):
        observed_profile(_spans(), T, until=1.5)


def test_rescaled_profile_keeps_the_calibrations_shape_at_the_runs_level():
    from digenrl.control.observed import rescaled_profile

    cal = ProfileCost.from_dict({"format": "digenrl-profile", "version": 1, "ops": {
        "denoise": [[1, 0.02], [4, 0.05]], "vae_decode": [[1, 0.0]], "reward": [[1, 0.01], [4, 0.01]],
        "transfer": [[1, 0.0]], "train_chunk": [[1, 0.1], [8, 0.4]], "allreduce": [[1, 0.0]],
        "optimizer": [[1, 0.1]], "publish": [[1, 0.05]], "tag_switch": [[1, 0.0]]}})
    observed = observed_profile(_spans(), T, until=4.0)
    gap = 0.02
    out = ProfileCost.from_dict(rescaled_profile(cal, observed, T))
    # generation on the generator: the run's fragment of 4 took (1.0 + 1.2) / 2 + gap; the calibration priced
    # T x 0.05 + 0.01; every size keeps the calibration's shape at that ratio
    r = ((1.0 + 1.2) / 2 + gap) / (T * 0.05 + 0.01)
    assert out.time("denoise", 1, "generator") == pytest.approx(0.02 * r)
    assert out.time("reward", 1, "generator") == pytest.approx(0.01 * r)
    r_tag = (1.0 + gap) / (T * cal.time("denoise", 2, "trainer") + 0.01)  # the trainer's TAG fragment of 2
    assert out.time("denoise", 4, "trainer") == pytest.approx(0.05 * r_tag)
    r_train = ((0.5 + 0.7) / 2 + gap) / 0.4
    assert out.time("train_chunk", 1, "trainer") == pytest.approx(0.1 * r_train)  # not 1/8 of the 8-cell chunk
    assert out.time("optimizer", 1, "trainer") == pytest.approx(0.1 * (0.2 + gap) / 0.1)
    assert out.time("publish", 1, "trainer") == pytest.approx(0.05 * (0.1 + gap) / 0.05)
    # a colocated run shows no publish: the calibration's stays
    no_pub = observed_profile([s for s in _spans() if s.kind != "publish"], T, until=4.0)
    assert ProfileCost.from_dict(rescaled_profile(cal, no_pub, T)).time("publish", 1, "trainer") == 0.05
    # a streamed publish: the generators' receive rescaled, the trainers' part 0 (their commit spans hold it)
    streamed = observed_profile([s for s in _spans() if s.kind != "publish"]
                                + [Span("gen0", "publish", 3.63, 4.13, "publish v1", "generator")], T, until=4.2)
    st = ProfileCost.from_dict(rescaled_profile(cal, streamed, T))
    assert st.time("publish", 1, "generator") == pytest.approx(0.05 * (0.5 + gap) / 0.05)
    assert st.time("publish", 1, "trainer") == 0.0


def test_a_trace_file_profiles_like_the_spans_it_was_written_from(tmp_path):
    """A run's ``trace.json`` read back (``read_chrome_trace``, as the CPU benchmarks profile their runs) keeps each
    action's size, so its profile is the one of the run's own spans; the sizes are the hand-written ones."""
    from digenrl.observe.trace import read_chrome_trace, write_chrome_trace

    back = read_chrome_trace(write_chrome_trace(_spans(), tmp_path / "trace.json"))
    assert [s.size for s in back] == [s.size for s in _spans()]
    got, want = (observed_profile(x, T, until=4.0, pools=(1, 1))["ops"] for x in (back, _spans()))
    assert got.keys() == want.keys()  # (times go through microseconds: equal to rounding)
    for op, rows in want.items():
        assert [n for n, _ in got[op]] == [n for n, _ in rows]
        assert [t for _, t in got[op]] == pytest.approx([t for _, t in rows], rel=1e-9)
