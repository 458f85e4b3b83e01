"""The disaggregated runtime: the scheduler's actions executed by Ray actors in wall-clock time (DESIGN.md 3).

Protocol (one run, ``driver.run_disaggregated``):

1. ``setup.runtime_plan(cfg)`` validates the config for the runtime and builds the ``StepPlan`` (the same
   pure plan the simulator runs); ``cluster.ray_session`` starts or joins Ray; ``cluster.start_pools`` creates
   the actors (``GeneratorWorker`` x N_g, ``TrainerWorker`` x N_t, placed by Ray resources) and forms the
   trainers' torch.distributed group (gradient sync only at the commit).
2. Version 0 is published to the generators; in TAG modes the workers measure a cost profile for BTS
   (``profile.calibrate``) unless ``runtime.profile`` names one.
3. The driver runs ``schedule.Scheduler``; ``executor.ActionExecutor`` turns each action into actor calls,
   moving only object refs (fragments stay in the object store; trainers fetch the fragments of the groups
   they train and compute the group's advantages themselves), and turns completions into events stamped with
   wall time since the run start.
4. ``records.RunRecorder`` collects the per-step metrics, versions per trajectory, spans (``trace.json`` /
   ``gantt.png``) and the scheduler's action/event log, which ``schedule.audit`` checks against I2-I4.

Failure: any worker error or death stops the run with ``WorkerFailure`` naming the worker and the step; the
trainers' open transactions are aborted (no partial step is committed) and checkpoints are only ever replaced
atomically.
"""

from .errors import WorkerFailure

__all__ = ["WorkerFailure"]
