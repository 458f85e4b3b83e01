"""What ``digenrl train`` says before a disaggregated run with a measured cost profile (``runtime.profile``) starts:
the predicted steady step time of its plan and of colocated on the same workers (``sim.config_source.colocated_on``,
the config's own values: the ``colocated`` row of ``digenrl simulate --config``), both simulated in virtual time
with the profile's costs (``sim.executor.steady_step_time``, 4 steps, as ``digenrl plan`` probes), and a warning when
colocated is predicted faster.

The profile's all-reduce was measured at its ``trainers`` ranks; another rank count (colocated runs on all
``generators + trainers`` workers) takes it as ``control.profile.profile_at`` says (the one policy: scaled as a
ring all-reduce scales; a profile without ``trainers`` is taken as measured on the config's own pools).
"""

from __future__ import annotations

from dataclasses import replace

PROBE_STEPS = 4


def _steady(plan, cost) -> float:
    from .executor import steady_step_time

    return steady_step_time(replace(plan, steps=PROBE_STEPS), cost)


def predict(cfg) -> dict | None:
    """``{"workers", "plan_s", "colocated_s" | "colocated_refused", "faster"}`` for a disaggregated ``cfg`` with
    ``runtime.profile``; None otherwise (colocated, or no profile). Colocated is the ``colocated`` row of
    ``digenrl simulate --config --profile`` (``config_source.colocated_source``, the config's own values)."""
    from ..control.profile import load_profile, profile_at, profile_pools
    from ..control.run_plan import plan_run
    from .config_source import colocated_source
    from .from_config import pools_for

    rt = cfg.runtime
    if rt.profile is None or rt.mode == "colocated":
        return None
    prof, measured = load_profile(rt.profile), profile_pools(rt.profile)[1] or rt.trainers
    workers = sum(pools_for(cfg, None))  # (a sequence-parallel generator counts its GPUs)
    own = profile_at(prof, measured, rt.trainers)
    if isinstance(own, str):
        return {"workers": workers, "refused": own}
    out = {"workers": workers, "plan_s": _steady(plan_run(cfg).plan, own)}
    at_all = profile_at(prof, measured, workers)  # (checked first: its refusal in the profile's own words)
    if isinstance(at_all, str):
        out["colocated_refused"] = at_all
        return out
    try:
        src = colocated_source(cfg, workers, profile=prof, profile_trainers=measured, pinned=True)
        cost, plan = src.build(src.start(src.own_split()))
    except ValueError as e:  # (the memory plan, the config's keys: ConfigError, planner.Infeasible)
        out["colocated_refused"] = str(e)
        return out
    out["colocated_s"] = _steady(plan, cost)
    out["faster"] = out["colocated_s"] < out["plan_s"]
    return out


def report(cfg, pred: dict | None) -> tuple[str | None, str | None]:
    """(the line for stdout, the warning for stderr) of ``predict``'s result."""
    if pred is None:
        return None, None
    rt = cfg.runtime
    head = f"digenrl: predicted with runtime.profile ({rt.profile}):"
    if "refused" in pred:
        return f"{head} not priced at {rt.trainers} trainer ranks ({pred['refused']})", None
    line = f"{head} {rt.mode} {rt.generators}+{rt.trainers} {pred['plan_s']:.4g} s/step (steady)"
    w = pred["workers"]
    if "colocated_s" not in pred:
        return f"{line}; colocated on the same {w} workers not priced ({pred['colocated_refused']})", None
    line += (f"; colocated on the same {w} workers {pred['colocated_s']:.4g} s/step: the plan is "
             f"{pred['colocated_s'] / pred['plan_s']:.2f}x colocated")
    warn = None
    if pred["faster"]:
        warn = (f"digenrl: warning: colocated on the same {w} workers is predicted faster than this {rt.mode} plan "
                f"({pred['colocated_s']:.4g} s against {pred['plan_s']:.4g} s per step); consider "
                f"runtime.mode=colocated runtime.generators=1 runtime.trainers={w}, or `digenrl plan --profile "
                f"{rt.profile}` for a faster split")
    return line, warn
