"""Virtual-time execution of the scheduler with a cost model (a peer of ``digenrl.runtime``).

* ``executor.simulate(plan, cost, jitter=..., seed=...)``: the control loop of ``digenrl.control`` with the
  ``VirtualExecutor``; returns a ``control.timeline.RunResult`` (spans, step statistics, BTS statistics, the
  action/event log that ``digenrl.schedule.audit.audit`` checks).
* cost models: ``roofline.RooflineCost`` (analytic, from ``presets``) and measured profiles
  (``digenrl.control.profile.ProfileCost``).
* ``planner``: plans, fragment sizes, chunk shapes and generator/trainer splits for a model/testbed;
  ``from_config``: a run config's own plan; ``cli.main``: ``digenrl simulate``.

Imports neither torch nor ray.
"""
