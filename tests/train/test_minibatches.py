"""Minibatches (docs/architecture.md, "Minibatches"): M optimizer steps per step, groups split by index, logp_old = behaviour log-prob."""

import pytest

from digenrl.config import ConfigError, load_config
from digenrl.schedule.plan import minibatch_of

from product import product_steps

SMALL = ["train.prompts_per_step=4", "train.generations=4", "sampler.num_steps=4", "train.timestep_fraction=0.5",
         "log.progress=false", "train.clip_range=1e-4"]


def test_minibatch_membership_is_contiguous_by_group_index():
    assert [minibatch_of(k, 8, 2) for k in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [minibatch_of(k, 5, 2) for k in range(5)] == [0, 0, 0, 1, 1]
    assert [minibatch_of(k, 3, 3) for k in range(3)] == [0, 1, 2]


def _step(tiny_policy, *overrides):
    """One step of the product (``digenrl train``'s path, in this process): the worker and the step's row."""
    worker, (row,) = product_steps(load_config(None, [*SMALL, *overrides]), policy=tiny_policy, steps=1)
    return worker.ctx, row


def test_second_minibatch_is_off_policy_and_clipped(tiny_policy):
    ctx, row = _step(tiny_policy, "train.minibatches_per_step=2", "train.inner_epochs=2")
    assert row["mismatch/approx_kl"] == 0.0 and row["mismatch/clipfrac"] == 0.0  # the first round: r == 1 exactly
    assert row["approx_kl"] > 0 and row["clipfrac"] > 0  # later rounds: the weights moved, r != 1, the clip acts
    assert ctx.transaction.version == 1  # published once, after the last commit
    assert ctx.optimizer.state[next(iter(ctx.optimizer.state))]["step"] == 4  # one optimizer step per commit


def test_single_minibatch_keeps_ratio_one(tiny_policy):
    _, row = _step(tiny_policy)
    assert row["approx_kl"] == 0.0 and row["cells"] == 4 * 4 * 2


def test_minibatches_reach_the_runtime_plan():
    """M x epochs become the plan's rounds in every mode (the scheduler commits once per round)."""
    from digenrl.control.run_plan import plan_run

    with pytest.raises(ConfigError, match="train.minibatches_per_step 9 exceeds"):
        load_config(None, ["train.minibatches_per_step=9", "train.prompts_per_step=8"])
    plan = plan_run(load_config(None, ["train.minibatches_per_step=2", "train.inner_epochs=3",
                                       "runtime.mode=gap_tsp"])).plan
    assert (plan.minibatches, plan.epochs, plan.rounds) == (2, 3, 6)
    assert plan.round_groups(0) == (0, 1, 2, 3) and plan.round_groups(1) == (4, 5, 6, 7)


def test_advantage_options_in_the_runtime_plan():
    """Step-wide statistics run in a pipelined mode, also with several minibatches (the plan is step-wide: its
    commits wait for the step's last reward); best-of-n runs in every mode (a plain plan: the trainers drop the
    unselected generations' cells)."""
    from digenrl.control.run_plan import plan_run

    assert plan_run(load_config(None, ["train.adv_baseline=batch", "runtime.mode=naive"])).plan.mode.value == "naive"
    assert plan_run(load_config(None, ["train.adv_std_unbiased=true", "train.adv_eps=1e-8",
                                       "runtime.mode=gap"])).plan is not None
    assert plan_run(load_config(None, ["train.adv_baseline=batch", "runtime.mode=gap"])).plan.mode.value == "gap"
    wide = plan_run(load_config(None, ["train.adv_baseline=batch", "runtime.mode=gap", "train.minibatches_per_step=2"]))
    assert wide.plan.step_wide and wide.plan.minibatches == 2
    assert not plan_run(load_config(None, ["runtime.mode=gap", "train.minibatches_per_step=2"])).plan.step_wide
    for mode in ("naive", "colocated", "gap", "gap_tsp", "gap_tsp_tag", "full"):
        plan = plan_run(load_config(None, ["train.best_of_n=4", f"runtime.mode={mode}"])).plan
        assert plan.mode.value == mode and not plan.sample_split
