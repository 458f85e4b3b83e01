"""The calibration times every generation size a run dispatches (``runtime.calibrate.plan_sizes``): the simulator
prices an action from the profile's points, and a size it lacks is extrapolated. A packed colocated worker takes its
share of the step's fragments in one action; a profile that held only the fragment size priced that batch as the
fragments one after the other (colocated +15-21% in ``benchmarks/pipeline_cpu.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "schedule"))
from sched_helpers import LinCost  # noqa: E402

CASES = [  # prompts, generations, fragment size, mode, trainers
    (8, 8, 4, "colocated", 2),  # benchmarks/pipeline_cpu.py: shares of 8 fragments, 32 generations
    (3, 6, 4, "colocated", 2),  # f does not divide G: fragments 4 + 2, shares of 3 fragments
    (5, 4, 2, "colocated", 3),  # 10 fragments over 3 workers: shares of 4, the last one 2
    (4, 8, 4, "gap_tsp", 1),
]


@pytest.mark.parametrize("prompts,gens,frag,mode,trainers", CASES)
def test_every_dispatched_generation_size_is_calibrated(prompts, gens, frag, mode, trainers):
    from digenrl.config import load_config
    from digenrl.control.run_plan import plan_run
    from digenrl.runtime.calibrate import plan_sizes
    from digenrl.schedule import Generate
    from digenrl.sim.executor import simulate

    cfg = load_config(None, [f"train.prompts_per_step={prompts}", f"train.generations={gens}",
                             f"runtime.fragment_size={frag}", f"runtime.mode={mode}", f"runtime.trainers={trainers}",
                             "steps=2", "runtime.tag_policy=none"])
    plan = plan_run(cfg).plan
    cost = LinCost({"denoise": (0.01, 0.01), "train_chunk": (0.01, 0.01), "reward": (0.001, 0.001)})
    res = simulate(plan, cost)
    sent = {sum(f.size for f in a.fragments) for _, a in res.actions if isinstance(a, Generate)}
    calibrated = set(plan_sizes(plan)[0])
    assert sent <= calibrated, f"dispatched {sorted(sent)}, calibrated {sorted(calibrated)}"
    if mode == "colocated":
        assert max(sent) > frag  # the shares are batches of several fragments (the case tests something)
