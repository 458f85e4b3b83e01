"""Faults that stop a run because going on would destroy its model.

``RunHalted`` is raised where a bad value would enter the weights: a reward function's output that is not one
finite float score per sample (``rewards.base``), a commit whose loss or gradient norm is not finite
(``train.transaction``; the optimizer is not stepped). A restart cannot help (the replay computes the same
values), so the Ray controller does not recover from it; ``digenrl train`` writes ``failure.json`` (the last
good resumable checkpoint stays, no checkpoint of the bad weights is written) and exits with code 2.
"""

from __future__ import annotations


class RunHalted(RuntimeError):
    """A run stopped on a value that would corrupt the model; the message names the step and the cause."""


def _chain(e: BaseException | None):
    """``(error, its cause attribute)`` along ``e``'s cause chain, each error once; ``cause`` is where
    ``ray.exceptions.RayTaskError`` keeps the worker's exception (``WorkerFailure``: its type and message)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        inner = getattr(e, "cause", None)
        yield e, inner
        e = e.__cause__ or (inner if isinstance(inner, BaseException) else None)


def find_halted(e: BaseException | None) -> RunHalted | None:
    """The ``RunHalted`` behind ``e`` (its cause chain, or a Ray task error's ``cause``), if there is one."""
    for x, inner in _chain(e):
        if isinstance(inner, RunHalted):
            return inner
        if isinstance(x, RunHalted) and type(x).__module__.startswith("digenrl"):
            return x
    return None


# Worker errors a restart meets again (same config, same files, same machine): the Ray controller does not
# replay them (``runtime.driver``); matched by type along the cause chain, or by the text torch gives a CUDA
# call on a machine without CUDA.
_DETERMINISTIC_TYPES = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError, ImportError)
_DETERMINISTIC_NAMES = ("ConfigError", "ModelFilesError", "AdapterError", "RewardConfigError", "PromptFileError",
                        "MemoryPlanError", "ArtifactError")  # digenrl's bad-input errors (by name: no imports)
_DETERMINISTIC_TEXT = ("Torch not compiled with CUDA enabled", "Found no NVIDIA driver", "No CUDA GPUs are available",
                       "invalid device ordinal", "CUDA driver version is insufficient")


def find_deterministic(e: BaseException | None) -> BaseException | None:
    """The error behind ``e`` (a ``WorkerFailure`` and its cause chain) that a restart would meet again: a
    config or file error (``ConfigError``, a missing file, a package that is not installed) or torch without
    CUDA; None when a retry may help."""
    for e, inner in _chain(e):
        for x in (e, inner):
            if isinstance(x, _DETERMINISTIC_TYPES) or any(c.__name__ in _DETERMINISTIC_NAMES for c in type(x).__mro__):
                return x
            if isinstance(x, BaseException) and any(t in str(x) for t in _DETERMINISTIC_TEXT):
                return x
        if isinstance(inner, str):  # WorkerFailure.cause: "<type name>: <message>" of the worker's error
            kind = inner.split(":", 1)[0].strip()
            names = {*_DETERMINISTIC_NAMES, "ModuleNotFoundError", *(t.__name__ for t in _DETERMINISTIC_TYPES)}
            if kind in names or any(t in inner for t in _DETERMINISTIC_TEXT):
                return e
    return None
