"""``runtime.clocks``: worker stamps on the driver's clock by an offset measured with round trips (Cristian's
method), checked against workers whose clocks are known to be off by a set amount."""

from __future__ import annotations

import time

import pytest

from digenrl.runtime.clocks import Clock, ClockSample, estimate_offset, measure_offsets


def _round_trip(offset: float, there: float, back: float, t: float = 100.0) -> ClockSample:
    """A round trip sent at driver time ``t`` to a worker whose clock reads driver time - ``offset``, taking
    ``there`` seconds to reach it and ``back`` seconds to return."""
    return ClockSample(send=t, worker=t + there - offset, recv=t + there + back)


@pytest.mark.parametrize("offset", [0.0, 1234.5, -0.02, -86400.0])
@pytest.mark.parametrize("there,back", [(1e-3, 1e-3), (5e-3, 1e-4), (0.0, 0.03)])
def test_the_offset_is_within_half_the_round_trip(offset, there, back):
    got, err = estimate_offset([_round_trip(offset, there, back)])
    assert err == pytest.approx((there + back) / 2)
    assert abs(got - offset) <= err + 1e-9
    assert got == pytest.approx(offset + (back - there) / 2)  # the midpoint: off by the delays' asymmetry


def test_the_shortest_round_trip_is_kept():
    samples = [_round_trip(7.0, 0.02, 0.0, t=1.0), _round_trip(7.0, 1e-4, 1e-4, t=2.0),
               _round_trip(7.0, 0.0, 0.05, t=3.0)]
    got, err = estimate_offset(samples)
    assert err == pytest.approx(1e-4) and got == pytest.approx(7.0)


def test_no_samples_or_a_backwards_round_trip_is_refused():
    with pytest.raises(ValueError, match="no clock samples"):
        estimate_offset([])
    with pytest.raises(ValueError, match="ends before it starts"):
        estimate_offset([ClockSample(send=2.0, worker=0.0, recv=1.0)])


def test_measured_offsets_place_skewed_worker_stamps_on_the_driver_clock():
    """Two 'workers' in this process: one reads the driver's clock, one a clock 1000 s behind it (another node's
    origin, or a wall clock stepped by that much); their stamps of one moment land at that moment."""
    ask = {"gen0": time.monotonic, "trn0": lambda: time.monotonic() - 1000.0}
    offsets, err = measure_offsets(ask, samples=3)
    assert offsets["gen0"] == pytest.approx(0.0, abs=err + 1e-9)
    assert offsets["trn0"] == pytest.approx(1000.0, abs=err + 1e-9)
    assert 0.0 <= err < 0.05
    clock = Clock()
    clock.use(offsets)
    before = clock.now()
    stamps = {w: f() for w, f in ask.items()}
    after = clock.now()
    for w, s in stamps.items():
        assert before - err - 1e-9 <= clock.at(w, s) <= after + err + 1e-9, w


def test_a_worker_without_an_offset_is_named():
    clock = Clock()
    clock.use({"gen0": 0.0})
    with pytest.raises(KeyError, match="trn1"):
        clock.at("trn1", 1.0)
