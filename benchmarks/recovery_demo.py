"""Recovery time of a Ray run on the demo: a clean run, then the same run with a generator and with a trainer
rank killed mid-step (the test hook ``DIGENRL_TEST_HOOKS=inject_failure=<worker>@<step>:exit``). Writes the seconds each failure cost.

    python benchmarks/recovery_demo.py [--steps 30] [--fail-step 13] [--out benchmarks/results/recovery_demo.json]
    python benchmarks/recovery_demo.py --part full [--steps 16 --fail-step 9 --checkpoint-every 4]

``--fail-step`` is numbered from 1, as the progress line and the hook.

Per run: wall time, restarts, and per recovery the restart time (failure detected -> fresh pools restored and
publishing) and the lost time (the publish of the replayed-from step -> restart done: the work that had to be
redone plus the restart), the step replayed from (the newest checkpoint, ``runtime.checkpoint_every``), and
whether the final weights equal the clean run's (max relative difference).

``--part full`` (also part of the default ``all``) measures ``runtime.mode=full`` (TCSS), whose step content
depends on timing (which fragments run one version stale): two clean runs and one with a generator killed, and
the max relative differences of their final weights (clean vs clean, killed vs clean), under ``full_mode`` in the
results file (``--part full`` replaces only that entry of an existing file).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run(overrides: list[str], run_dir: Path) -> dict:
    """One run; an override ``hook:<hook>`` is a test hook (``DIGENRL_TEST_HOOKS``), not a config key."""
    from digenrl.config import load_config
    from digenrl.runtime.driver import run_training

    cfg = load_config(None, [f"run_dir={run_dir}", *(o for o in overrides if not o.startswith("hook:"))])
    hooks = ";".join(o.removeprefix("hook:") for o in overrides if o.startswith("hook:"))
    os.environ["DIGENRL_TEST_HOOKS"] = hooks
    t0 = time.perf_counter()
    try:
        summary = run_training(cfg, ray=True)
    finally:
        os.environ.pop("DIGENRL_TEST_HOOKS", None)
    return {"wall_s": time.perf_counter() - t0, "restarts": summary["restarts"],
            "recoveries": summary["recoveries"], "step_time_s": summary["step_time_s"]}


def max_rel(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    ta, tb = load_file(str(a)), load_file(str(b))
    return max(float((ta[k] - tb[k]).norm() / tb[k].norm().clamp_min(1e-12)) for k in tb)


def full_mode(base: list[str], fail_step: int) -> dict:
    """Two clean ``full`` runs and one with gen0 killed at ``fail_step``; the differences of their weights."""
    out: dict = {"config": base, "fail_step": fail_step, "load_avg_1m": os.getloadavg()[0], "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, extra in (("clean", []), ("clean_again", []),
                            ("generator_killed", [f"hook:inject_failure=gen0@{fail_step}:exit"])):
            out["runs"][name] = run(base + extra, tmp / name)
            print("full", name, json.dumps(out["runs"][name]))
        final = {n: tmp / n / "checkpoint.safetensors" for n in out["runs"]}
        out["max_rel_diff_clean_vs_clean"] = max_rel(final["clean_again"], final["clean"])
        out["max_rel_diff_killed_vs_clean"] = max_rel(final["generator_killed"], final["clean"])
        out["max_rel_diff_killed_vs_clean_again"] = max_rel(final["generator_killed"], final["clean_again"])
    out["load_avg_1m_after"] = os.getloadavg()[0]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--fail-step", type=int, default=13)
    ap.add_argument("--checkpoint-every", type=int, default=5)
    ap.add_argument("--out", default=str(HERE / "results" / "recovery_demo.json"))
    ap.add_argument("--part", choices=("all", "gap_tsp", "full"), default="all")
    args = ap.parse_args(argv)
    common = [f"steps={args.steps}", f"runtime.checkpoint_every={args.checkpoint_every}", "eval.every=0",
              "log.progress=false"]
    base = ["runtime.mode=gap_tsp", *common]
    out: dict = {"config": base, "fail_step": args.fail_step, "load_avg_1m": os.getloadavg()[0], "runs": {}}
    if args.part == "full":
        old = Path(args.out)
        out = json.loads(old.read_text()) if old.is_file() else {}
        out["full_mode"] = full_mode(["runtime.mode=full", *common], args.fail_step)
        Path(args.out).write_text(json.dumps(out, indent=1))
        print(f"wrote {args.out}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, extra in (("clean", []), ("generator_killed", [f"hook:inject_failure=gen0@{args.fail_step}:exit"]),
                            ("trainer_killed", [f"hook:inject_failure=trn0@{args.fail_step}:exit"])):
            res = run(base + extra, tmp / name)
            if name != "clean":
                res["max_rel_diff_vs_clean"] = max_rel(tmp / name / "checkpoint.safetensors",
                                                       tmp / "clean" / "checkpoint.safetensors")
            out["runs"][name] = res
            print(name, json.dumps(res))
    out["load_avg_1m_after"] = os.getloadavg()[0]
    if args.part == "all":
        out["full_mode"] = full_mode(["runtime.mode=full", *common], args.fail_step)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
