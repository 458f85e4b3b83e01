"""The runtime: the scheduler's actions executed by real workers in wall-clock time (a peer of ``digenrl.sim``,
which executes them in virtual time). The workers are Ray actors, or, for a run of one colocated worker, the same
classes as objects of this process (``local``: Ray is not imported). Every ``digenrl train`` runs here.

One run (``driver.run_training``): ``control.run_plan.plan_run`` validates the config and builds the ``StepPlan``
the simulator runs too; ``cluster`` (Ray) or ``local`` starts the workers (``workers.GeneratorAPI`` /
``TrainerAPI`` declare what the controller may call), version 0 is published, TAG modes calibrate (``calibrate``);
then the shared control loop (``control.loop.run_loop``) drives ``executor.WorkerExecutor``, which moves refs,
never tensors, and ``control.timeline`` / ``step_metrics`` record spans, the action log (audited against I2-I4),
per-step metrics and every trajectory's version.

Failure: any worker error or death stops the run with ``WorkerFailure`` naming the worker and the step; the
trainers' open transactions are aborted (no partial step is committed) and checkpoints are only ever replaced
atomically."""

from .errors import WorkerFailure

__all__ = ["WorkerFailure"]
