"""``as_interrupted`` finds the stop signal behind whatever error it came back as, and nothing else."""

from __future__ import annotations

import pytest

from digenrl.train.interrupt import Interrupted, as_interrupted


def _raised(fn):
    try:
        fn()
    except Exception as e:
        return e
    raise AssertionError("nothing raised")


def test_an_error_raised_over_the_stop_in_a_finally():
    stop = Interrupted("SIGINT")

    def broken_cleanup():
        try:
            raise stop
        finally:
            raise AttributeError("type object 'tqdm' has no attribute '_lock'")

    err = _raised(broken_cleanup)
    assert isinstance(err, AttributeError) and as_interrupted(err) is stop


def test_a_wrapper_of_the_stop_and_a_system_error_from_it():
    stop = Interrupted("SIGTERM")

    def wrapped():
        try:
            raise stop
        except Exception as e:  # what get_named / the executor do with what ray.get raised
            raise RuntimeError("worker gen0 failed") from e

    assert as_interrupted(_raised(wrapped)) is stop
    system = SystemError("<built-in method wait> returned a result with an exception set")
    system.__cause__ = stop
    assert as_interrupted(system) is stop and as_interrupted(stop) is stop


@pytest.mark.parametrize("err", [ValueError("x"), None])
def test_no_stop_behind_other_errors(err):
    def chained():
        try:
            raise KeyError("first")
        except KeyError:
            raise OSError("second") from err

    assert as_interrupted(_raised(chained)) is None
    assert as_interrupted(AttributeError("alone")) is None and as_interrupted(None) is None
