"""The I1 reference of the suite: a single-process run written from the formulas, sharing no training code with
the product (``loop.py``; the formulas and their sources: ``formulas.py``). The product runs every mode,
colocated included, through the scheduler and the control loop; the invariance tests compare its parameters
with this reference's."""

from .loop import Reference, reference_run

__all__ = ["Reference", "reference_run"]
