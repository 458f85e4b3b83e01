"""What the simulator and the Ray runtime share, below both (they never import each other).

* ``run_plan``: a validated config -> the ``StepPlan`` both execute, the worker ids, the trained timesteps;
* ``profile``: measured cost profiles (``digenrl profile`` writes them; the simulator and BTS read them);
* ``loop``: the one control loop (completions -> scheduler events -> actions -> executor), the executor
  protocol and the tie rule;
* ``timeline``: spans, the action/event log and the run-level figures, trace and Gantt of a run.

Nothing here imports torch or ray.
"""
