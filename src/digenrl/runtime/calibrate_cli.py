"""``digenrl profile [--config X] [key=value ...] --out profile.json``: measure this machine's costs. The workers'
logs go beside the profile (``profile.logs/`` for ``profile.json``), not into the config's ``run_dir``: profiling is
not a run, and a run_dir it wrote into would be refused by the next ``digenrl train`` there."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="digenrl profile", description="Measure this machine's costs for "
                                 "digenrl simulate --profile and runtime.profile (one generator and the trainer ranks of the config).")
    ap.add_argument("--config", "-c", default=None, help="YAML config (default: the built-in CPU demo)")
    ap.add_argument("--out", required=True, help="profile JSON to write (digenrl simulate --profile)")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats per point, their mean is the cost (default 3)")
    from digenrl.cli_args import add_overrides, parse_with_overrides

    args = parse_with_overrides(add_overrides(ap), argv)  # KEY=VALUE positionals and --set (runtime.* sets the pools)
    from digenrl.config import ConfigError, load_config
    from digenrl.control.profile import save_profile
    from digenrl.control.run_plan import plan_run

    from .calibrate import calibrate, plan_sizes, sizes_upto
    from .cluster import ray_session, start_pools

    out = Path(args.out)
    try:
        if args.repeats < 1:
            raise ConfigError(f"--repeats: must be >= 1 (got {args.repeats})")
        if not out.parent.is_dir():
            raise ConfigError(f"--out: directory {str(out.parent)!r} does not exist")
        cfg = load_config(args.config, args.overrides)
        run = plan_run(cfg)
    except ConfigError as e:
        print(f"digenrl profile: error: {e}", file=sys.stderr)
        return 2
    G, S = run.plan.generations, run.trained_timesteps
    logs = out.parent / f"{out.stem}.logs"
    with ray_session(run):
        pools = start_pools(run, log_dir=logs)
        try:
            gen = sorted(set(sizes_upto(G)) | set(plan_sizes(run.plan)[0]))  # (with a packed share, TAG gangs)
            data = calibrate(run, pools, args.repeats, gen, sizes_upto(G * S), trainer_generation=True)
        finally:
            pools.kill()
    save_profile(data, out)
    print(f"wrote {out} ({len(data['ops'])} op curves; use: digenrl simulate --profile {out} ...); "
          f"worker logs in {logs}")
    return 0
