"""Virtual-time execution of the scheduler with a cost model (DESIGN.md section 3).

* ``executor.simulate(plan, cost, jitter=..., seed=...)``: discrete-event run of ``digenrl.schedule.Scheduler``;
  returns spans (``digenrl.observe.trace.Span``), step statistics, BTS statistics, and the action/event log
  (``digenrl.schedule.audit.audit`` checks it against the invariants).
* cost models: ``roofline.RooflineCost`` (analytic, from ``presets``) and ``profile.ProfileCost`` (measured
  JSON profile, schema in ``profile``).
* ``planner``: plans, fragment sizes, chunk shapes and generator/trainer splits for a model/testbed;
  ``cli.main``: ``digenrl simulate``.
"""
