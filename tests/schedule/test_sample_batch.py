"""``StepPlan.sample_batch`` (``sampler.batch_size``): a generation action of n samples is priced as the runtime
samples it, in batches of at most b (``train.step_math.generate``), against the formula written out here; the
config reaches the runtime's plan and the simulator's."""

from __future__ import annotations

from dataclasses import replace

import pytest

from digenrl.schedule import PlanError
from digenrl.schedule.cost import Durations

from sched_helpers import LinCost, make_plan

COEF = {"denoise": (0.3, 0.05), "vae_decode": (0.2, 0.01), "reward": (0.1, 0.002), "transfer": (0.01, 0.001)}


def _sampled(n: int, T: int) -> float:
    """One batch of n: T denoising steps, the decode and the reward, each a fixed part plus n per-sample parts."""
    (dd, dn), (vd, vn), (rd, rn) = COEF["denoise"], COEF["vae_decode"], COEF["reward"]
    return T * (dd + dn * n) + (vd + vn * n) + (rd + rn * n)


@pytest.mark.parametrize("batch,parts", [(None, [12]), (5, [5, 5, 2]), (4, [4, 4, 4]), (12, [12]), (64, [12])])
def test_a_share_is_priced_in_batches_of_the_sample_batch(batch, parts):
    plan = replace(make_plan("colocated", prompts=3, generations=4, fragment_size=2, T=5, n_train=1), packed=True,
                   sample_batch=batch)
    n = plan.colocated_share * plan.fragment_size  # the worker's whole share: 12 samples in one action
    want = sum(_sampled(k, 5) for k in parts) + COEF["transfer"][0] + COEF["transfer"][1] * n
    assert Durations(plan, LinCost(COEF)).generate(n, True, False) == pytest.approx(want, rel=1e-12)


def test_a_sample_batch_below_one_is_refused():
    with pytest.raises(PlanError, match="sample_batch"):
        replace(make_plan("colocated", n_train=1), sample_batch=0)


def test_the_config_reaches_the_runtime_plan_and_the_simulator():
    from digenrl.config import load_config
    from digenrl.control.run_plan import plan_run
    from digenrl.sim.config_source import run_config_modes
    from digenrl.sim.presets import TESTBEDS

    assert plan_run(load_config(None, ["sampler.batch_size=3"])).plan.sample_batch == 3

    def colocated(*sets):
        return run_config_modes("configs/flux1_dev.yaml", ["steps=3", *sets], ["colocated"],
                                testbed=TESTBEDS["B"])["colocated"]

    runs = {None: colocated(), 3: colocated("sampler.batch_size=3")}
    assert runs[3].plan.sample_batch == 3 and runs[None].plan.sample_batch is None
    assert runs[3].result.step_time > runs[None].result.step_time  # 144 a worker in batches of 3: more fixed costs
