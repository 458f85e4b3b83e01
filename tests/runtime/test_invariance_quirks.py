"""I1 for Flow-GRPO's quirk options (issue 21, item 3): the Ray runtime ends where the reference (``tests/reference``) does.

* ``train.ema_update=per_micro_batch`` in a pipelined mode (gap_tsp, 2 trainer ranks, 2 minibatches): the
  checkpoint holds the EMA weights, k = P G / (M micro_batch) = 12 / (2 x 3) = 2 updates per commit on rank 0, whatever the
  chunking (the trainers' chunks are not the loop's micro-batches);
* ``train.zero_adv_refill`` in a barrier mode (naive, 2 trainer ranks, beta_kl > 0, one tied group per step):
  the re-added samples are the same on every rank and in the loop (seeded by run seed and step), they train
  (their KL) and count in the commit's mean.

(``train.minibatch_split=samples`` and ``train.best_of_n``: tests/runtime/test_invariance_selection.py.)
"""

from __future__ import annotations

import pytest

from runtime_helpers import make_cfg, reference_run, run_matches, tied_reward_server
from test_sharded_pool import _errors

STEPS = 2
RTOL_TENSOR, RTOL_GLOBAL = 5e-5, 1e-6  # M = 2: the second minibatch's clipped ratio amplifies float noise
# (tests/runtime/test_invariance.py, RTOL_MINIBATCHES)


@pytest.fixture(scope="module")
def reward_url():
    with tied_reward_server(STEPS) as server:
        yield server.url


EMA = [f"steps={STEPS}", "train.prompts_per_step=3", "train.ema_decay=0.9", "train.ema_every=1",
       "train.minibatches_per_step=2", "runtime.trainers=2", "runtime.mode=gap_tsp"]
REFILL = [f"steps={STEPS}", "train.prompts_per_step=3", "train.beta_kl=0.05", "train.zero_adv_refill=true",
          "train.micro_batch=4", "runtime.trainers=2", "runtime.mode=naive"]  # R = 12 / 4 = 3: 8 kept -> 9


@pytest.mark.slow
@pytest.mark.parametrize("case", ["ema", "refill"])
def test_quirk_option_matches_the_reference(case, ray_local, tiny_model, tmp_path, reward_url):
    remote = f"reward={{remote: {{url: '{reward_url}'}}}}"
    if case == "ema":
        on, off = [*EMA, remote, "train.ema_update=per_micro_batch", "train.micro_batch=3"], [*EMA, remote]  # k = 2
    else:
        on, off = [*REFILL, remote], [*REFILL[:3], remote]
    ref, rows = reference_run(tiny_model, tmp_path / "ref", on, eval_weights=True)
    if case == "refill":
        assert [r["kept_fraction"] for r in rows] == [0.75] * STEPS  # 9 of 12: one of the tied group re-added
    cfg = make_cfg(tiny_model, tmp_path / "run", *on)
    assert cfg.steps == STEPS
    run_matches(cfg, ref, RTOL_TENSOR, RTOL_GLOBAL, case)
    other, _ = reference_run(tiny_model, tmp_path / "off", off, eval_weights=True)
    assert _errors(other, ref)[0] > 100 * RTOL_TENSOR  # the option changes the result (the test can fail)
