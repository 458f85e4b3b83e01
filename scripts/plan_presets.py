"""Plan every shipped preset with ``digenrl plan`` on its target testbed and write the plan into its YAML.

    python scripts/plan_presets.py                 # plan configs/*.yaml and rewrite them in place
    python scripts/plan_presets.py --check         # exit 1 if a preset is not what the planner chooses now
    python scripts/plan_presets.py sd35_medium     # only these presets (names or paths)

Each preset carries a plan block (comments, so the strict config loader never sees it) just above its
``runtime:`` section::

    # --- plan: written by scripts/plan_presets.py; do not edit by hand ---
    # plan: testbed B, 8 GPUs, mode gap_tsp_tag
    # gap_tsp_tag: 3+5, fragment 4, chunk 24x2, publish object_store: predicted 198.8 s/step
    # colocated on the same 8 GPUs: 8 coloc, packed 144 per worker, chunk 24x3: predicted 252.5 s/step
    # default: gap_tsp_tag, 1.27x colocated
    # --- end plan ---

The ``# plan:`` line is the input (the roofline testbed, the GPUs to split, the disaggregated mode planned); the
rest is output. A preset without a block is planned on testbed B with its own pools and mode. The planner is the
one of ``digenrl plan`` (``sim.plan_cli.plan_from_args``: the split x fragment x chunk search of the mode, the
shard-group count of a sharded pool (``sim.planner``), the publish path and, in ``full``, the stale hold
(``sim.planner``), then the colocated baseline on the same GPUs, planned the same way); predicted times are
steady step times in virtual time. The preset's ``runtime.mode / generators / trainers / fragment_size / publish``
(``max_stale_fraction`` and ``tuning.stale_hold`` in ``full``), ``tuning.tag_inference_copy`` where the plan has it
(or the preset names it) and ``train.chunk_generations / chunk_timesteps``
(``train.chunk_cells`` removed) are set to the faster of the two (``publish`` only where the default is
disaggregated), and ``train.shard_groups`` where the plan has more than one group (or the preset names it): where
colocated is predicted faster the preset defaults to ``colocated`` and its block says so. Train keys other than
the chunk shape and the shard groups are never touched (they are pinned to the peer recipes). The rewritten file is loaded back and must plan (``control.run_plan.plan_run``) to the
priced plan.

Each preset takes 1-60 s of CPU (``digenrl plan``'s pruned search); they are planned one
after the other.
"""

import argparse
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from doc_check import write_or_check  # noqa: E402

CONFIGS = ROOT / "configs"
BEGIN = "# --- plan: written by scripts/plan_presets.py; do not edit by hand ---"
END = "# --- end plan ---"
INPUT = re.compile(r"^# plan: testbed (?P<testbed>\S+), (?P<gpus>\d+) GPUs, mode (?P<mode>\S+)\s*$")
DEFAULT_TESTBED = "B"


@dataclass(frozen=True)
class Target:
    testbed: str
    gpus: int
    mode: str


@dataclass
class Planned:
    """What the planner chose for one preset (plain values: what the YAML records)."""

    target: Target
    mode: str             # the default the preset gets: target.mode, or "colocated" where that is faster
    generators: int
    trainers: int
    fragment_size: int
    chunk: tuple[int, int]
    max_stale_fraction: float
    publish: str          # runtime.publish of the plan (searched on the testbed: ``sim.planner``)
    stale_hold: float     # tuning.stale_hold of the plan (searched in ``full`` with a joined publish)
    shard_groups: int     # train.shard_groups of the plan (searched for a sharded pool: ``sim.planner``)
    tag_copy: bool        # tuning.tag_inference_copy of the plan (searched for TAG on a shard group)
    plan_label: str
    plan_s: float
    colocated_label: str | None
    colocated_s: float | None
    colocated_refused: str | None
    plan: object = None   # the StepPlan of the default (checked against the rewritten file)


def target_of(text: str, cfg) -> Target:
    """The ``# plan:`` input line of ``text``, or the preset's own pools and mode on testbed B."""
    for line in text.splitlines():
        m = INPUT.match(line)
        if m:
            return Target(m["testbed"], int(m["gpus"]), m["mode"])
    rt = cfg.runtime
    gpus = rt.trainers if rt.mode == "colocated" else rt.generators + rt.trainers
    return Target(DEFAULT_TESTBED, gpus, rt.mode)


def plan_preset(path: Path, sets: tuple[str, ...] = (), probe_steps: int = 4, exhaustive: int = 64,
                descend_splits: int = 3) -> Planned:
    """Run ``digenrl plan``'s search for one preset on its target (``sets``: extra overrides, for tests)."""
    from digenrl.config import load_config
    from digenrl.sim.plan_cli import build_parser, plan_from_args

    text = path.read_text()
    t = target_of(text, load_config(str(path), list(sets)))
    if t.mode == "colocated":
        raise SystemExit(f"{path}: '# plan:' names mode colocated; name the disaggregated mode to plan")
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["--config", str(path), "--testbed", t.testbed, "--gpus", str(t.gpus), "--out",
                str(Path(tmp) / "plan.yaml"), "--probe-steps", str(probe_steps), "--exhaustive", str(exhaustive),
                "--descend-splits", str(descend_splits), *_start(t, path)]
        for s in sets:
            argv += ["--set", s]
        _, res, _ = plan_from_args(build_parser().parse_args(argv))
    b, co = res.best, res.colocated
    pick = co if co is not None and co.step_time < b.step_time else b
    c = pick.candidate
    return Planned(t, "colocated" if pick is co else t.mode, 1 if c.split.n_gen == 0 else c.generators,
                   c.split.n_train, c.fragment_size, (pick.plan.chunk_generations, pick.plan.chunk_timesteps),
                   c.max_stale_fraction, res.config.runtime.publish, res.config.tuning.stale_hold,
                   res.config.train.shard_groups, res.config.tuning.tag_inference_copy,
                   b.candidate.label(b.plan), b.step_time,
                   co.candidate.label(co.plan) if co is not None else None, co.step_time if co is not None else None,
                   res.colocated_refused, pick.plan)


def _start(t: Target, path: Path) -> list[str]:
    """``--set`` overrides that make the search independent of the values a previous run wrote (so ``--check``
    after a rewrite plans the same): the target mode, an even split, fragments of 4, and as chunk shape the most
    cells a colocated rank fits on the testbed's GPU (``train.chunk_cells=auto`` there; 8 x 2 if none fits). The
    disaggregated search starts from it, with the object-store publish, no stale hold and one shard group; the
    colocated baseline takes its own chunk whatever the config's (``sim.config_source``: ``train.chunk_cells=auto``
    on each candidate, its sequence-parallel degree included)."""
    from digenrl.config import load_config
    from digenrl.control.run_plan import plan_run
    from digenrl.sim.presets import testbed_preset
    from digenrl.train.memory import MemoryPlanError
    from digenrl.train.memory_check import resolve_chunk_cells
    sets = {"runtime.mode": t.mode, "runtime.generators": t.gpus // 2, "runtime.trainers": t.gpus - t.gpus // 2,
            "runtime.fragment_size": 4, "runtime.publish": "object_store", "tuning.stale_hold": 0,
            "train.chunk_cells": "null", "train.chunk_generations": 8, "train.chunk_timesteps": 2,
            "train.shard_groups": 1, "tuning.tag_inference_copy": False}
    tb = testbed_preset(t.testbed)
    co = load_config(str(path), [f"{k}={v}" for k, v in sets.items()] + [
        "runtime.mode=colocated", "runtime.generators=1", f"runtime.trainers={t.gpus}", "train.chunk_cells=auto",
        f"train.memory_gb={(tb.gpu2 or tb.gpu).memory_gb}"])
    try:
        co = resolve_chunk_cells(co, plan_run(co).trained_timesteps)
        sets.update({"train.chunk_generations": co.train.chunk_generations,
                     "train.chunk_timesteps": co.train.chunk_timesteps})
    except MemoryPlanError:
        pass
    return [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]


def block(p: Planned) -> list[str]:
    t = p.target
    out = [BEGIN, f"# plan: testbed {t.testbed}, {t.gpus} GPUs, mode {t.mode}",
           f"# `digenrl plan --testbed {t.testbed} --gpus {t.gpus}` (roofline costs, steady step time in virtual time):",
           f"# {t.mode}: {p.plan_label}: predicted {p.plan_s:.4g} s/step"]
    if p.colocated_s is not None:
        out.append(f"# colocated on the same {t.gpus} GPUs: {p.colocated_label}: predicted {p.colocated_s:.4g} s/step")
        ratio = p.colocated_s / p.plan_s
        if p.mode == "colocated":
            out.append(f"# default: colocated -- predicted faster than {t.mode} ({t.mode} is {ratio:.2f}x colocated)")
        else:
            out.append(f"# default: {t.mode}, {ratio:.2f}x colocated")
    else:
        out.append(f"# colocated on the same {t.gpus} GPUs: refused ({p.colocated_refused})")
        out.append(f"# default: {t.mode} (colocated does not fit)")
    return out + [END]


def _section(lines: list[str], name: str) -> tuple[int, int]:
    """[start, end) of the top-level ``name:`` section (start: the header line)."""
    start = next((i for i, ln in enumerate(lines) if ln.rstrip() == f"{name}:"), None)
    if start is None:
        raise SystemExit(f"no top-level '{name}:' section")
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end].startswith((" ", "#"))
                                and not lines[end].startswith(BEGIN)):
        end += 1
    while end > start + 1 and not lines[end - 1].startswith("  "):  # trailing comments / blanks belong outside
        end -= 1
    return start, end


def _set(lines: list[str], name: str, key: str, value, comment: str = "") -> None:
    """Set ``name.key`` (a two-space indented line) to ``value``; appended at the section's end if missing (and
    the section at the file's end)."""
    if not any(ln.rstrip() == f"{name}:" for ln in lines):
        lines += ["", f"{name}:"]
    start, end = _section(lines, name)
    line = f"  {key}: {value}"
    if comment:
        line = f"{line:<38}# {comment}"
    for i in range(start + 1, end):
        if re.match(rf"^  {re.escape(key)}:", lines[i]):
            lines[i] = line
            return
    lines.insert(end, line)


def _drop(lines: list[str], name: str, key: str) -> None:
    start, end = _section(lines, name)
    for i in range(start + 1, end):
        if re.match(rf"^  {re.escape(key)}:", lines[i]):
            del lines[i]
            return


def rewrite(text: str, p: Planned) -> str:
    """``text`` with the plan block and the planned runtime / chunk values (everything else kept)."""
    lines = text.splitlines()
    if BEGIN in lines:
        i, j = lines.index(BEGIN), lines.index(END)
        del lines[i:j + 1]
    # the chunk shape: in place of chunk_cells (auto) or the previous planned values
    start, end = _section(lines, "train")
    at = next((i for i in range(start + 1, end) if re.match(r"^  chunk_(cells|generations|timesteps):", lines[i])),
              None)
    for k in ("chunk_cells", "chunk_generations", "chunk_timesteps"):
        _drop(lines, "train", k)
    shape = [f"  {'chunk_generations: ' + str(p.chunk[0]):<36}# planned (plan block above runtime:): "
             "generations x timesteps", f"  chunk_timesteps: {p.chunk[1]}"]
    if at is None:
        _, at = _section(lines, "train")
    lines[at:at] = shape
    _set(lines, "runtime", "mode", p.mode, "planned: see the plan block above")
    _set(lines, "runtime", "generators", p.generators)
    _set(lines, "runtime", "trainers", p.trainers)
    _set(lines, "runtime", "fragment_size", p.fragment_size)
    for k in ("stale_hold", "tag_inference_copy"):  # the planner's outputs live under tuning: (config.load.MOVED)
        _drop(lines, "runtime", k)
    if p.mode == "full":
        _set(lines, "runtime", "max_stale_fraction", f"{p.max_stale_fraction:g}")
        _set(lines, "tuning", "stale_hold", f"{p.stale_hold:g}")
    if p.mode != "colocated":
        _set(lines, "runtime", "publish", p.publish)
    if (p.tag_copy and p.mode != "colocated") or re.search(r"^  tag_inference_copy:", text, re.M):
        _set(lines, "tuning", "tag_inference_copy", str(p.tag_copy and p.mode != "colocated").lower())
    if p.shard_groups > 1 or re.search(r"^  shard_groups:", text, re.M):  # (a colocated default: k = 1 divides)
        _set(lines, "train", "shard_groups", p.shard_groups if p.mode != "colocated" else 1)
    start, _ = _section(lines, "runtime")
    lines[start:start] = block(p)
    return "\n".join(lines) + "\n"


def check_written(text: str, p: Planned) -> None:
    """The rewritten preset loads and plans to the priced plan (else the script has a bug)."""
    from digenrl.config import load_config
    from digenrl.control.run_plan import plan_run

    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(text)
        f.flush()
        cfg = load_config(f.name)
    from dataclasses import fields, replace

    from digenrl.sim.config_source import _unsharded_colocated

    if p.plan is None:
        return
    got = plan_run(_unsharded_colocated(cfg)).plan
    want = replace(p.plan, steps=got.steps, sampling_steps=got.sampling_steps)  # (the probe length; MixGRPO-Flash)
    if got != want:
        diff = [f.name for f in fields(got) if getattr(got, f.name) != getattr(want, f.name)]
        raise RuntimeError(f"plan_presets: the rewritten preset does not plan to the priced plan ({diff})")


def presets(names: list[str]) -> list[Path]:
    if not names:
        return sorted(CONFIGS.glob("*.yaml"))
    return [Path(n) if n.endswith(".yaml") else CONFIGS / f"{n}.yaml" for n in names]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a preset differs from what the planner chooses")
    ap.add_argument("names", nargs="*", help="presets to plan (names in configs/ or YAML paths; default: all)")
    args = ap.parse_args(argv)
    rc = 0
    for path in presets(args.names):
        print(f"planning {path.name} ...", file=sys.stderr, flush=True)
        p = plan_preset(path)
        text = rewrite(path.read_text(), p)
        check_written(text, p)
        root = ROOT if path.resolve().is_relative_to(ROOT) else path.resolve().parent
        rc |= write_or_check(path.resolve(), text, args.check, "scripts/plan_presets.py", root)
    return rc


if __name__ == "__main__":
    sys.exit(main())
