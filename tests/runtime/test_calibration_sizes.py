"""The calibration times every generation size a run dispatches (``runtime.calibrate.plan_sizes``): the simulator
prices an action from the profile's points, and a size it lacks is extrapolated. A packed colocated worker takes its
share of the step's fragments in one action; a profile that held only the fragment size priced that batch as the
fragments one after the other (colocated +15-21% in ``benchmarks/pipeline_cpu.py``); a TAG gang on a shard group
(up to one fragment per lane) was priced from the fragment size alone."""

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
    (4, 8, 2, "gap_tsp_tag", 4),  # FSDP over 4 ranks: TAG gangs of up to 4 fragments (8 generations)
    (3, 6, 4, "gap_tsp_tag", 4),  # fragments 4 + 2: gangs of other sums
]


@pytest.mark.parametrize("prompts,gens,frag,mode,trainers", CASES)
def test_every_dispatched_generation_size_is_calibrated(prompts, gens, frag, mode, trainers):
    from digenrl.config import load_config
    from digenrl.control.run_plan import plan_run
    from digenrl.runtime.calibrate import plan_sizes
    from digenrl.schedule import Generate
    from digenrl.sim.executor import simulate

    tag = mode == "gap_tsp_tag"
    cfg = load_config(None, [f"train.prompts_per_step={prompts}", f"train.generations={gens}",
                             f"runtime.fragment_size={frag}", f"runtime.mode={mode}", f"runtime.trainers={trainers}",
                             "steps=2", f"runtime.tag_policy={'greedy' if tag else 'none'}",
                             *(["train.sharding=fsdp"] if tag else [])])
    plan = plan_run(cfg).plan
    cost = LinCost({"denoise": (0.01, 0.01), "train_chunk": (0.01, 0.002), "reward": (0.001, 0.001)})
    res = simulate(plan, cost)
    gens_of = [(a.tag, sum(f.size for f in a.fragments)) for _, a in res.actions if isinstance(a, Generate)]
    calibrated = sorted(plan_sizes(plan)[0])
    plain, gangs = {n for t, n in gens_of if not t}, {n for t, n in gens_of if t}
    assert plain <= set(calibrated), f"dispatched {sorted(plain)}, calibrated {calibrated}"
    # a TAG gang is priced between two timed sizes, never extrapolated from the smallest
    assert all(calibrated[0] <= n <= calibrated[-1] for n in gangs), f"gangs {sorted(gangs)}, calibrated {calibrated}"
    if mode == "colocated":
        assert max(plain) > frag  # the shares are batches of several fragments (the case tests something)
    if tag:
        assert max(gangs) > frag  # gangs of several fragments were dispatched


def test_the_batches_of_sampler_batch_size_are_calibrated():
    """With ``sampler.batch_size`` b the simulator prices an action of n as batches of b and n mod b: those sizes
    are timed (a packed share of 16 in batches of 3: 3 and 1), beside the action sizes themselves."""
    from digenrl.config import load_config
    from digenrl.control.run_plan import plan_run
    from digenrl.runtime.calibrate import plan_sizes

    over = ["train.prompts_per_step=8", "train.generations=4", "runtime.fragment_size=4", "runtime.mode=colocated",
            "runtime.trainers=2"]
    assert plan_sizes(plan_run(load_config(None, over)).plan)[0] == [4, 16]
    assert plan_sizes(plan_run(load_config(None, [*over, "sampler.batch_size=3"])).plan)[0] == [1, 3, 4, 16]
