"""``runtime.collective_timeout_s``: validated, and a timed-out collective of a trainer call becomes an error naming
the worker, its rank and the call (``collectives.collective_action``), while other errors pass unchanged."""

from __future__ import annotations

import pytest

from digenrl.config import ConfigError, load_config
from digenrl.runtime.collectives import CollectiveTimeout, collective_action
from digenrl.schedule import Chunk

# what gloo raised in a 2-rank all_reduce that the other rank never joined (torch 2.13, timeout 3 s)
GLOO_TIMEOUT = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
                "waiting 3000ms for recv operation to complete")


class _Rank:
    def __init__(self, world: int, error: Exception):
        self.name, self.rank, self._world, self._error = "trainer-1", 1, world, error
        self.cfg = load_config(None, ["runtime.collective_timeout_s=3"])

    @collective_action
    def train(self, chunk, refs: list, step_stats: dict | None = None):
        raise self._error

    @collective_action
    def commit(self, step: int, round: int = 0, final: bool = True, grad_scale: float = 1.0):
        raise self._error


def test_default_and_validation():
    assert load_config(None, []).runtime.collective_timeout_s == 600.0
    for bad in ("0", "-1", ".inf", ".nan"):
        with pytest.raises(ConfigError, match="runtime.collective_timeout_s"):
            load_config(None, [f"runtime.collective_timeout_s={bad}"])


def test_a_timed_out_collective_names_the_rank_and_the_call():
    chunk = Chunk(step=3, group=1, cells=((0, 0), (1, 0)), round=0)
    with pytest.raises(CollectiveTimeout) as err:
        _Rank(2, RuntimeError(GLOO_TIMEOUT)).train(chunk, [object()], None)
    msg = str(err.value)
    # the scheduler's step 3 is the fourth: numbered from 1, as the progress line and the failure line
    assert msg.startswith("trainer-1 (trainer rank 1 of 2): train(chunk=step 4 group 1 round 0, 2 cells) waited "
                          "longer than runtime.collective_timeout_s = 3 s in a collective"), msg
    assert GLOO_TIMEOUT in msg and isinstance(err.value.__cause__, RuntimeError)
    with pytest.raises(CollectiveTimeout, match=r"commit\(step=5, final=False\)"):
        _Rank(2, RuntimeError(GLOO_TIMEOUT)).commit(4, final=False)


def test_other_errors_and_a_single_rank_pass_unchanged():
    other = RuntimeError("chunk of step 3 round 0 but the weights are version 2")
    with pytest.raises(RuntimeError) as err:
        _Rank(2, other).commit(3)
    assert err.value is other
    with pytest.raises(RuntimeError) as err:
        _Rank(1, RuntimeError(GLOO_TIMEOUT)).commit(3)
    assert not isinstance(err.value, CollectiveTimeout)
    with pytest.raises(ValueError):
        _Rank(2, ValueError("timed out")).commit(3)
