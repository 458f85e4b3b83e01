"""The layout rules of the architecture page (docs/architecture.md), checked on the source itself.

* ``runtime/`` and ``sim/`` are peers: neither imports the other (at any depth of a module, lazily or not);
* no import cycle between the modules of ``src/digenrl`` (lazy imports inside functions count too), nor between
  its packages (``train`` -> ``control`` -> ``train`` through any modules is a cycle too);
* ``schedule/`` imports no other part of digenrl; ``control/`` (below both executors) imports neither ``sim/``
  nor ``runtime/``;
* the planning path (``digenrl.sim``, ``digenrl.control``, ``simulate --config``) runs without torch or ray.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PKG = SRC / "digenrl"


def _module(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every digenrl module ``path`` imports (module level or inside functions), resolved to module names."""
    mod = _module(path)
    pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.add(name)
            out.update(f"{name}.{a.name}" for a in node.names)  # "from pkg import module"
    return {m for m in out if m.split(".")[0] == "digenrl"}


def _graph() -> dict[str, set[str]]:
    files = {_module(p): p for p in PKG.rglob("*.py")}
    graph = {}
    for mod, path in files.items():
        graph[mod] = {m for m in _imports(path) if m in files and m != mod}
    return graph


def test_the_graph_is_read():  # the checks below would pass vacuously on an empty graph
    g = _graph()
    assert "digenrl.runtime.driver" in g and "digenrl.control.loop" in g["digenrl.runtime.driver"]
    assert "digenrl.control.loop" in g["digenrl.sim.executor"]


def test_runtime_and_sim_are_peers():
    g = _graph()
    bad = [(m, d) for m, deps in g.items() for d in deps
           if (m.startswith("digenrl.runtime") and d.startswith("digenrl.sim"))
           or (m.startswith("digenrl.sim") and d.startswith("digenrl.runtime"))]
    assert not bad, bad


def test_control_imports_neither_sim_nor_runtime():
    """control/ sits below both executors (DESIGN.md section 5): what it needs of a cost model is the interface."""
    g = _graph()
    bad = [(m, d) for m, deps in g.items() for d in deps
           if m.startswith("digenrl.control") and d.startswith(("digenrl.sim", "digenrl.runtime"))]
    assert not bad, bad


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``g`` (module -> imported modules) as a path, or None. A package importing its own
    submodules (its ``__init__``) is not an edge."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(g.get(m, ())):
            if d.startswith(m + "."):
                continue
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if state.get(d) is None:
                cyc = visit(d)
                if cyc:
                    return cyc
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(g):
        if state.get(m) is None:
            cyc = visit(m)
            if cyc:
                return cyc
    return None


def test_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"p": {"p.x"}, "p.x": set()}) is None


def test_no_import_cycles():
    cyc = find_cycle(_graph())
    assert cyc is None, " -> ".join(cyc)


def package(module: str) -> str:
    """``digenrl.X`` for ``digenrl.X.y.z``; a top-level module (``digenrl.config``) is its own package."""
    return ".".join(module.split(".")[:2])


def package_graph(g: dict[str, set[str]]) -> dict[str, set[str]]:
    """Packages -> the packages their modules import (the root ``digenrl/__init__`` left out: it only holds the
    version)."""
    out: dict[str, set[str]] = {}
    for m, deps in g.items():
        for d in deps:
            a, b = package(m), package(d)
            if a != b and b != "digenrl":
                out.setdefault(a, set()).add(b)
    return out


def test_package_graph_is_read():
    p = package_graph({"digenrl.train.a": {"digenrl.control.b"}, "digenrl.control.b": {"digenrl.train.c"},
                       "digenrl.train.c": set()})
    assert p == {"digenrl.train": {"digenrl.control"}, "digenrl.control": {"digenrl.train"}}
    assert find_cycle(p) == ["digenrl.control", "digenrl.train", "digenrl.control"]


def test_no_package_cycles():
    cyc = find_cycle(package_graph(_graph()))
    assert cyc is None, " -> ".join(cyc)


def _imports_of(pkg: str) -> dict[str, set[str]]:
    return {m: deps for m, deps in _graph().items() if package(m) == pkg}


def test_schedule_imports_nothing_else_of_digenrl():
    mods = _imports_of("digenrl.schedule")
    assert len(mods) > 5
    bad = {m: sorted(d for d in deps if package(d) != "digenrl.schedule") for m, deps in mods.items()}
    assert not {m: d for m, d in bad.items() if d}, bad


BLOCK = (
    "import sys\n"
    "class Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] in ('torch', 'ray'):\n"
    "            raise ImportError('blocked: ' + name)\n"
    "sys.meta_path.insert(0, Block())\n")


def test_planning_path_imports_neither_torch_nor_ray(tmp_path):
    profile = {"format": "digenrl-profile", "version": 1,
               "ops": {"denoise": [[1, 0.004]], "vae_decode": [[1, 0.0001]], "reward": [[1, 0.0005]],
                       "transfer": [[1, 0.0001]], "train_chunk": [[1, 0.006]], "allreduce": [[1, 0.001]],
                       "optimizer": [[1, 0.003]], "publish": [[1, 0.002]], "tag_switch": [[1, 0.0]]}}
    p = tmp_path / "p.json"
    p.write_text(json.dumps(profile))
    code = BLOCK + (
        "import digenrl.sim, digenrl.sim.cli, digenrl.control.loop, digenrl.control.timeline\n"
        "from digenrl.sim.cli import main\n"
        f"rc = main(['--config', 'default', '--profile', {str(p)!r}, '--json', '--set', 'steps=2'])\n"
        "assert rc == 0, rc\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'ray')]\n"
        "assert not bad, bad\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads(out.stdout)
    assert {r["mode"] for r in rows} >= {"naive", "colocated", "full"}


def test_the_executor_imports_no_torch():
    """The controller's executor moves object refs and plain numbers: the loss scale and the advantages are the
    trainers' (``train.loss_scale``). runtime/executor.py imports no torch, lazily or not, nor loads it."""
    tree = ast.parse((PKG / "runtime" / "executor.py").read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert names and not [m for m in names if m.split(".")[0] == "torch"], sorted(names)
    code = BLOCK + ("import digenrl.runtime.executor\n"
                    "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'ray')]\n"
                    "assert not bad, bad\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_an_in_process_run_never_imports_ray(tmp_path):
    """``digenrl train`` of one colocated worker (the default config) runs the scheduler and the controller with
    the workers in this process (``runtime.local``): with Ray blocked it trains, writes its outputs and never
    imports ``ray``. The same blocker makes a Ray run fail at once (the test can fail)."""
    block_ray = BLOCK.replace("('torch', 'ray')", "('ray',)")
    run = tmp_path / "run"
    small = ["steps=2", "train.prompts_per_step=2", "train.generations=4", "sampler.num_steps=4",
             "eval.num_prompts=4", "eval.grid_prompts=2", "eval.every=1", "log.progress=false"]
    code = block_ray + (
        "from digenrl.cli import main\n"
        f"rc = main(['train', 'run_dir={run}', *{small!r}, *sys.argv[1:]])\n"
        "bad = [m for m in sys.modules if m.split('.')[0] == 'ray']\n"
        "assert not bad, bad\n"
        "sys.exit(rc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["transport"] == "in-process" and summary["audit_violations"] == [] and summary["version"] == 2
    ray_run = subprocess.run([sys.executable, "-c", code, f"run_dir={tmp_path / 'ray'}", "--ray"],
                             capture_output=True, text=True, timeout=300)
    assert ray_run.returncode != 0 and "blocked: ray" in ray_run.stderr, ray_run.stderr[-2000:]
