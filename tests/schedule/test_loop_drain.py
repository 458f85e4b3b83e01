"""``control.loop.run_loop`` drains the observer's side calls (evals, checkpoints) still in flight when the schedule
is done: their completions reach the timeline and the observer, feed the scheduler nothing and move no event time
(the oracle: the makespan of the same run without the side call)."""

from __future__ import annotations

from digenrl.control.loop import Completion, Interval, run_loop
from digenrl.control.timeline import Timeline
from digenrl.schedule import Scheduler
from digenrl.sim.executor import VirtualExecutor

from sched_helpers import LinCost, make_plan

COST = LinCost({"denoise": (0.01, 0.02), "vae_decode": (0.0, 0.005), "reward": (0.002, 0.0), "transfer": (0.001, 0.0),
                "train_chunk": (0.05, 0.03), "allreduce": (0.01, 0.0), "optimizer": (0.02, 0.0),
                "publish": (0.04, 0.0), "tag_switch": (0.0, 0.0)})


class _SideCallExecutor(VirtualExecutor):
    """A virtual executor with one side call that answers only once every action has completed."""

    side: Completion | None = None

    @property
    def idle(self) -> bool:
        return super().idle and self.side is None

    def wait(self) -> list[Completion]:
        if super().idle and self.side is not None:
            done, self.side = self.side, None
            return [done]
        return super().wait()


class _Observer:
    def __init__(self, ex: _SideCallExecutor):
        self.ex, self.seen, self.after = ex, [], 0

    def on_completion(self, c: Completion) -> None:
        self.seen.append(c)
        if len(self.seen) == 1:  # a side call started at the first completion, answered after the last action
            self.ex.side = Completion(None, c.end, 1e6, (Interval("g0", c.end, 1e6),), side="eval", step=0)

    def after_wait(self) -> None:
        self.after += 1


def test_side_calls_in_flight_at_the_end_are_drained():
    plan = make_plan("gap_tsp", T=3)
    plain = run_loop(Scheduler(plan), VirtualExecutor(plan, COST), Timeline(plan))
    ex, timeline = _SideCallExecutor(plan, COST), Timeline(plan)
    obs = _Observer(ex)
    sched = Scheduler(plan)
    end = run_loop(sched, ex, timeline, obs)
    assert sched.done and ex.idle
    assert end == plain  # the side call's completion is no scheduler event
    assert obs.seen[-1].side == "eval" and obs.after >= 2  # observed, and a last after_wait once it is in
    assert [s.kind for s in timeline.spans if s.end == 1e6] == ["eval"]
