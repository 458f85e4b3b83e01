"""The declared worker interfaces: the worker classes implement them, and the controller calls nothing else."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from digenrl.runtime.generator import GeneratorWorker
from digenrl.runtime.trainer import TrainerWorker
from digenrl.runtime.workers import GeneratorAPI, TrainerAPI

RUNTIME = Path(__file__).resolve().parents[2] / "src" / "digenrl" / "runtime"
CONTROLLER = ("executor.py", "driver.py", "cluster.py", "calibrate.py", "calibrate_cli.py")


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


def test_the_controller_calls_only_declared_methods():
    declared = set(_declared(GeneratorAPI)) | set(_declared(TrainerAPI))
    called = set()
    for name in CONTROLLER:
        called |= set(re.findall(r"\.(\w+)\.(?:remote|options)\(", (RUNTIME / name).read_text()))
    assert called, "found no actor calls: the pattern is stale"
    assert called <= declared, sorted(called - declared)


SRC = RUNTIME.parent


def test_methods_called_by_name_on_rank0_are_declared():
    """``ActorPools.on_rank0("method", ...)`` calls a trainer method by name (``getattr``): every such name in
    the package is a declared ``TrainerAPI`` method, and every call names its method with a string literal."""
    declared = set(_declared(TrainerAPI))
    named, dynamic = set(), []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        for m in re.finditer(r"\.on_rank0\(\s*([^,)]*)", text):
            lit = re.fullmatch(r"""(['"])(\w+)\1""", m.group(1).strip())
            if lit:
                named.add(lit.group(2))
            else:
                dynamic.append(f"{path.relative_to(SRC)}: on_rank0({m.group(1)}")
    assert {"evaluate", "pack_state", "checkpoint_bytes"} <= named, f"the pattern is stale: found {sorted(named)}"
    assert not dynamic, dynamic
    assert named <= declared, sorted(named - declared)
