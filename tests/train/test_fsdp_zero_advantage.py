"""``train.sharding=fsdp`` with zero-advantage cells (issue 21): a rank whose share of a chunk holds only cells
that ``filter_zero_advantage`` drops must still join the chunk's all-gathers (``train_cells(collective=True)``
forwards a throw-away cell with weight 0), or the other rank waits in its forward until the process group's
timeout. 2 spawned gloo ranks (``zero_adv_worker``) train chunks where one rank's share is all zero, both are,
and both mix, then commit (twice); the gathered gradients, the committed parameters and the cell statistics (trained
cells, loss and KL sums) equal those of the unsharded single-process path training the same chunks whole.

Before the fix (the early return on every rank; checked by running this test against that ``train_cells``)
it fails within seconds: rank 1, having skipped the first chunk's forward, runs ahead into the next chunk's
collectives, which meet rank 0's pending all-gather, and gloo aborts rank 1 ("Received data size doesn't match
expected size. Is there a distributed collective mismatch ...", SIGABRT), so ``mp.spawn`` raises. A rank that
waits instead (the runtime's rank 1 idles until its next call) fails after the process group's timeout
(``TIMEOUT_S`` here, ``runtime.collective_timeout_s`` in a run); ``pytest.mark.timeout`` is only a backstop.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

TIMEOUT_S = 30.0  # the ranks' collective timeout: a rank left alone in a collective fails after this


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.timeout(300)  # a backstop only: the collective timeout ends a hang long before
def test_fsdp_rank_with_only_zero_advantage_cells_joins_the_chunk(tmp_path):
    import torch.multiprocessing as mp

    import zero_adv_worker

    mp.spawn(zero_adv_worker.run, args=(2, _free_port(), str(tmp_path), TIMEOUT_S), nprocs=2, join=True)
    r0, r1 = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert r0["stats"] == r1["stats"]
    for ref, (s0, s1) in zip(r0["ref_stats"], r0["stats"]):  # per round
        assert ref["trained"] == 4 and s0["trained"] == 3 and s1["trained"] == 1  # kept: gens 0, 2 at 2 timesteps
        assert s0["loss"] + s1["loss"] == pytest.approx(ref["loss"], rel=1e-5, abs=1e-6)  # parts ~0.5 cancel
        assert s0["kl"] + s1["kl"] == pytest.approx(ref["kl"], rel=1e-5, abs=1e-9)
    assert r0["ref_stats"][-1]["kl"] > 0  # the KL of the last round is not trivially 0
    assert r0["same_grad_names"] and r0["grad_norm"] > 0 and r0["moved"]
    assert r0["grad_rel"] < 1e-5 and r0["param_rel"] < 1e-5, r0
