"""The declared worker interfaces: the worker classes implement them, and the controller calls nothing else."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from digenrl.runtime.generator import GeneratorWorker
from digenrl.runtime.trainer import TrainerWorker
from digenrl.runtime.workers import GeneratorAPI, TrainerAPI

RUNTIME = Path(__file__).resolve().parents[2] / "src" / "digenrl" / "runtime"
SRC = RUNTIME.parent
CONTROLLER = ("executor.py", "driver.py", "cluster.py", "calibrate.py", "calibrate_cli.py", "pools.py", "local.py",
              "between_steps.py")


def _declared(proto) -> dict:
    return {n: f for c in proto.__mro__ if c.__name__.endswith("API") for n, f in vars(c).items()
            if callable(f) and not n.startswith("_")}


def test_workers_implement_their_protocols():
    for cls, proto in ((GeneratorWorker, GeneratorAPI), (TrainerWorker, TrainerAPI)):
        declared = _declared(proto)
        assert {"ping", "setup_dist"} <= set(declared)
        for name, fn in declared.items():
            impl = next((vars(c)[name] for c in cls.__mro__ if name in vars(c) and not c.__name__.endswith("API")),
                        None)
            assert impl is not None, f"{cls.__name__}.{name} is declared by {proto.__name__} but not implemented"
            want = list(inspect.signature(fn).parameters)
            # (ray.remote adds a tracing parameter to the class it wraps once a test made it remote)
            got = [p for p in inspect.signature(impl).parameters if not p.startswith("_ray")]
            assert got == want, f"{cls.__name__}.{name}{got} != {proto.__name__}.{name}{want}"


# a worker method is named by a string literal at each of these calls; a bare ``method`` only where one of them
# forwards its own parameter (``WorkerPools.on_rank0`` -> ``call``, ``_Controller.rank0`` -> ``on_rank0``)
CALLS = r"(?<!def )(?:\bcall\(\s*[^,()]+,|\.on_rank0\(|\brank0\()\s*([^,)]*)"
FORWARDING = {("runtime/pools.py", "method"), ("runtime/driver.py", "method")}


def _named_calls() -> tuple[set, list]:
    named, dynamic = set(), []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for m in re.finditer(CALLS, path.read_text()):
            arg = m.group(1).strip()
            lit = re.fullmatch(r"""(['"])(\w+)\1""", arg)
            if lit and lit.group(2) != "method":  # ("method": the placeholder of the docstrings)
                named.add(lit.group(2))
            elif not lit and (rel, arg) not in FORWARDING and arg:
                dynamic.append(f"{rel}: {m.group(0)}")
    return named, dynamic


def test_the_controller_calls_only_declared_methods():
    """Every worker call goes through ``WorkerPools.call(worker, "method", ...)`` (or rank 0's calls), the method
    named by a string literal whatever the transport, and names a declared method; no Ray call bypasses them."""
    declared = set(_declared(GeneratorAPI)) | set(_declared(TrainerAPI))
    named, dynamic = _named_calls()
    assert {"generate", "generate_gang", "train", "commit", "publish", "evaluate", "pack_state",
            "checkpoint_bytes", "restore_state", "calibration_start", "calibration_run",
            "calibration_end"} <= named, f"the pattern is stale: found {sorted(named)}"
    assert not dynamic, dynamic
    assert named <= declared, sorted(named - declared)
    direct = [f"{name}: {o}.{c}.remote(" for name in CONTROLLER  # (calibration's own echo actor is no worker)
              for o, c in re.findall(r"(\w*)\.(\w+)\.(?:remote|options)\(", (RUNTIME / name).read_text())
              if c in declared and o != "echo"]
    assert not direct, direct
