"""The runtime: the scheduler's actions executed by real workers in wall-clock time (a peer of ``digenrl.sim``,
which executes them in virtual time): Ray actors, or for a run of one colocated worker the same classes as
objects of this process (``local``: Ray is not imported). Every ``digenrl train`` runs here, through
``driver.run_training``; the parts and their order: docs/architecture.md ("Executors" to "The controller").
A failed worker raises ``WorkerFailure`` naming the worker and the step."""

from .errors import WorkerFailure

__all__ = ["WorkerFailure"]
