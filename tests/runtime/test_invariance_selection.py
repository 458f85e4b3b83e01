"""I1 for the options that train a subset of a step's samples (issue 21, item 2): the Ray runtime ends where the
reference (``tests/reference``) does.

* ``train.best_of_n`` (DanceGRPO ``--bestofn``) in a pipelined mode (gap_tsp, 2 trainer ranks, 2 minibatches,
  beta_kl > 0, no zero-advantage filter: the tied group's selected samples train their KL and count) and on a
  sharded pool (``train.sharding=fsdp``, 2 ranks, gap, ``std_mode=global``: the rounds start before the step's
  last reward, trained provisionally), with a tied group (its selected samples have A = 0: filtered, so the
  commit divides by fewer samples than the selection);
  in full mode (TCSS with a stale cap of 0, TAG, 2 trainer ranks) and with Flow-GRPO's refill drawn among
  the selected samples (naive);
* ``train.minibatch_split=samples`` (Flow-GRPO's random permutation of the samples into minibatches) in the
  barrier modes: naive (2 trainer ranks, 2 minibatches x 2 inner epochs, beta_kl > 0, with the refill as
  train_sd3.py), colocated (2 workers,
  with best-of-n too) and naive on a sharded pool with best-of-n (chunks of 2 cells: a rank whose one cell is
  masked joins the collectives with weight 0 while the other trains).

Oracle: ``tests/reference`` (it selects rows, written from the peers' formulas; the trainers mask cells). Each case also
checks that the option changes the result (the test can fail).
"""

from __future__ import annotations

import pytest

from runtime_helpers import make_cfg, reference_run, run_matches, tied_reward_server
from test_sharded_pool import _errors

STEPS = 2
RTOL_TENSOR, RTOL_GLOBAL = 5e-5, 1e-6  # M = 2 (tests/runtime/test_invariance_quirks.py)

BASE = [f"steps={STEPS}", "train.prompts_per_step=3"]
CASES = {
    "best_of_n_gap_tsp": (["train.best_of_n=2", "train.minibatches_per_step=2", "train.beta_kl=0.05",
                           "train.filter_zero_advantage=false", "runtime.trainers=2", "runtime.mode=gap_tsp"], 1),
    "best_of_n_fsdp": (["train.best_of_n=2", "train.std_mode=global", "runtime.trainers=2",
                        "train.sharding=fsdp", "runtime.mode=gap"], 1),
    "best_of_n_full": (["train.best_of_n=2", "runtime.mode=full", "runtime.max_stale_fraction=0",
                        "runtime.trainers=2"], 1),  # TCSS without stale samples: I1 holds
    "samples_fsdp_naive": (["train.minibatch_split=samples", "train.best_of_n=2", "train.minibatches_per_step=2",
                            "train.chunk_timesteps=1", "runtime.trainers=2", "train.sharding=fsdp",
                            "runtime.mode=naive"], 2),  # a chunk = 2 generations: often one rank's only is masked
    "best_of_n_refill_naive": (["train.best_of_n=2", "train.zero_adv_refill=true", "train.micro_batch=4",
                                "train.beta_kl=0.05", "runtime.trainers=2", "runtime.mode=naive"], 1),
    # kept 2 + 2 + 0 of the selected -> R = 12 / 4 = 3 needs 6: both selected samples of the tied group re-added
    "samples_naive": (["train.minibatch_split=samples", "train.minibatches_per_step=2", "train.inner_epochs=2",
                       "train.zero_adv_refill=true", "train.micro_batch=4", "train.beta_kl=0.05",
                       "runtime.trainers=2", "runtime.mode=naive"], 1),  # train_sd3.py's refill + permutation
    "samples_colocated": (["train.minibatch_split=samples", "train.best_of_n=2", "train.minibatches_per_step=2",
                           "runtime.trainers=2", "runtime.mode=colocated"], 2),  # the option(s) to switch off
}


@pytest.fixture(scope="module")
def reward_url():
    with tied_reward_server(STEPS) as server:
        yield server.url


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_selection_option_matches_the_reference(case, ray_local, tiny_model, tmp_path, reward_url):
    opts, n_opts = CASES[case]
    on = [*BASE, *opts, f"reward={{remote: {{url: '{reward_url}'}}}}"]
    ref, _ = reference_run(tiny_model, tmp_path / "ref", on)
    cfg = make_cfg(tiny_model, tmp_path / "run", *on)
    assert cfg.steps == STEPS
    run_matches(cfg, ref, RTOL_TENSOR, RTOL_GLOBAL, case)
    off = [o for o in on if o not in opts[:n_opts]]
    other, _ = reference_run(tiny_model, tmp_path / "off", off)
    assert _errors(other, ref)[0] > 100 * RTOL_TENSOR  # the option changes the result
