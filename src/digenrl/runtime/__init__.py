"""The runtime: the scheduler's actions executed by real workers in wall-clock time (a peer of ``digenrl.sim``,
which executes them in virtual time). The workers are Ray actors, or, for a run of one colocated worker, the same
classes as objects of this process (``local``: Ray is not imported). Every ``digenrl train`` runs here.

Protocol (one run, ``driver.run_training``):

1. ``digenrl.control.run_plan.plan_run(cfg)`` validates the config and builds the ``StepPlan`` (the same pure
   plan the simulator runs); on Ray, ``cluster.ray_session`` starts or joins Ray and checks that the pools can be
   placed; ``cluster.start_pools`` creates the actors (``GeneratorWorker`` x N_g, ``TrainerWorker`` x N_t,
   placed by Ray resources), or ``local.start_local_pools`` the objects, and ``cluster.ready_pools`` forms the
   trainers' torch.distributed group (gradient sync only at the commit).
2. Version 0 is published to the generators; in TAG modes the workers measure a cost profile for BTS
   (``calibrate.calibrate``, with the workers' ``timing``) unless ``runtime.profile`` names one.
3. The driver runs the shared control loop (``digenrl.control.loop.run_loop``) with ``executor.WorkerExecutor``,
   which turns each action into worker calls (``pools.WorkerPools``), moving only refs (fragments stay in the object store;
   trainers fetch the fragments of the groups they train and compute the group's advantages themselves), and
   reports completions stamped with wall time since the run start.
4. ``control.timeline`` records spans (``trace.json`` / ``gantt.png``) and the action/event log, which
   ``schedule.audit`` checks against I2-I4; ``step_metrics`` writes the per-step metrics and the version of
   every trajectory.

Worker interfaces: ``workers.GeneratorAPI`` / ``workers.TrainerAPI`` declare what the controller may call.

Failure: any worker error or death stops the run with ``WorkerFailure`` naming the worker and the step; the
trainers' open transactions are aborted (no partial step is committed) and checkpoints are only ever replaced
atomically.
"""

from .errors import WorkerFailure

__all__ = ["WorkerFailure"]
