"""The BTS section of docs/simulation.md, from the BTS benchmark results files only (no simulation here):

* ``benchmarks/results/bts_quality.json`` (``benchmarks/bts_quality.py``): greedy vs BTS depth 0 / 2 / 4;
* ``benchmarks/results/bts_agreement.json`` (``benchmarks/bts_agreement.py``): decisions on the same bubbles;
* ``benchmarks/results/op_jitter.json`` (``benchmarks/op_jitter.py``): the measured per-op spread;
* ``benchmarks/results/bts_online.json`` (``benchmarks/bts_online.py``): a profile that misjudges the machine,
  static vs online refinement;
* ``benchmarks/results/bts_depth.json`` (``benchmarks/bts_depth.py``): depth 0 / 2 / 4 on workloads chosen to
  give the deeper search a chance (heterogeneous pools, TCSS, off-optimum splits, jitter), and the default.

Every number in the section is a value of those files.
"""

from __future__ import annotations

import json
from pathlib import Path

from simdoc_render import NAMES, canonical_models, table

FILES = {"quality": "bts_quality.json", "agreement": "bts_agreement.json", "jitter": "op_jitter.json",
         "online": "bts_online.json", "depth": "bts_depth.json"}
POLICY_NAMES = {"none": "no TAG", "greedy": "greedy", "bts_d0": "BTS d0", "bts_d2": "BTS d2", "bts_d4": "BTS d4",
                "bts_d2_small_ties": "BTS d2, ties to k = 0", "bts_d2_static": "BTS d2, static profile"}
LEVEL_NAMES = {"exact": "exact costs", "in_process": "in-process jitter", "runtime": "runtime jitter"}


def load(results_dir: Path) -> dict:
    """The results files (a missing file: None), each model in the registry's spelling."""
    return {key: canonical_models(json.loads((results_dir / name).read_text())) if (results_dir / name).exists()
            else None for key, name in FILES.items()}


def _p(v: float | None, signed: bool = True) -> str:
    if v is None:
        return "-"
    return f"{v:+.2%}" if signed else f"{v:.1%}"


def jitter_part(j: dict, levels: dict) -> list[str]:
    kinds = sorted({k for lv in levels.values() for k in lv})
    rows = []
    for k in kinds:
        ip = (j.get("in_process") or {}).get("kinds", {}).get(k, {})
        rt = j.get("kinds", {}).get(k, {})
        rows.append([k, f"{ip['sigma']:.3f}" if ip else "-", ip.get("n", "-"),
                     f"{rt['sigma_fast']:.3f}" if rt else "-", f"{rt['sigma_total']:.3f}" if rt else "-",
                     f"{rt['ac1_mean']:.2f}" if rt else "-", rt.get("n", "-")])
    ip = j.get("in_process") or {}
    srcs = sorted({t["trace"].split("/")[0] for t in j.get("traces", [])})
    return [
        "Jitter is measured, not assumed (`benchmarks/op_jitter.py`, `benchmarks/results/op_jitter.json`): "
        "sigma is the std of log(duration / median) per operation. *In-process*: the CPU pipeline workload's "
        f"ops timed {ip.get('repeats', '?')} times back to back in one process (1-min load average "
        f"{ip.get('load_average_1min', 0):.1f} on 2 cores). *Runtime*: spans of the Ray runtime "
        f"({len(srcs)} runs of 200 steps: {', '.join(srcs)}), after removing slow drift with a rolling median "
        f"of {j.get('window', '?')} spans (`sigma_fast`, the part an independent per-op factor represents); "
        "`ac1` is the lag-1 autocorrelation of the raw spread (0: independent). Both are CPU time-sharing "
        "noise on this shared machine, so they bound a GPU's per-op jitter from above rather than estimate it.\n",
        table(rows, ["action kind", "in-process sigma", "n", "runtime sigma_fast", "runtime sigma_total",
                     "runtime ac1", "n"]) + "\n"]


def summary_part(q: dict) -> list[str]:
    rows = []
    for key, v in q["summary"].items():
        lvl, pol = key.split("/")
        if pol == "greedy":
            continue
        w, t, l_ = v["steady_wtl"]
        rows.append([LEVEL_NAMES.get(lvl, lvl), POLICY_NAMES.get(pol, pol), _p(v["mean_vs_greedy"]), _p(v["min"]),
                     _p(v["max"]), f"{v['wins']} / {v['ties']} / {v['losses']}",
                     f"{_p(v['steady_mean_vs_greedy'])} ({w} / {t} / {l_})", f"{v['tag_fragments_per_step']:.1f}",
                     f"{v['budget_hits']} / {v['decisions']}",
                     _p(v["span_error_mean"], False) if v["span_error_mean"] is not None else "-"])
    n_cfg = len(q["per_config"])
    return [
        f"Step time relative to the greedy rule over {n_cfg} preset configurations (8 model/testbed presets x "
        f"`gap_tsp_tag` and `full`; {q['steps']} steps; split chosen by the planner with BTS depth 2; jittered "
        f"levels: seeds {', '.join(map(str, q['seeds']))}). Negative = faster than greedy; wins / ties / losses "
        f"with a {q['tie_band']:.1%} tie band. Step time = makespan / steps; steady = (last commit - first "
        f"commit) / (steps - 1), without the pipeline fill. The search budget is {q['default_budget_nodes']} nodes per decision "
        "(deterministic: these numbers do not depend on the machine's load). The prediction error is that of "
        "each step's first decision against the span it predicted, |realized - predicted commit| / (predicted "
        "commit - decision time).\n",
        table(rows, ["costs", "policy", "step time vs greedy, mean", "min", "max", "wins / ties / losses",
                     "steady vs greedy (W / T / L)", "TAG frags / step", "budget hits / decisions",
                     "prediction error (span)"]) + "\n",
        f"Greedy inserts {_greedy_tags(q)} TAG fragments per step on average at the same levels.\n"]


def _greedy_tags(q: dict) -> str:
    return " / ".join(f"{q['summary'][k]['tag_fragments_per_step']:.1f} ({LEVEL_NAMES[k.split('/')[0]]})"
                      for k in q["summary"] if k.endswith("/greedy"))


def per_config_part(q: dict) -> list[str]:
    lv = [k for k in ("exact", "runtime") if q["per_config"] and k in q["per_config"][0]]
    rows = []
    for c in q["per_config"]:
        r = [f"{NAMES.get(c['model'], c['model']).split('-')[0]} {c['testbed']}", c["mode"], c["gen_gpus"],
             f"{c['greedy_step_s_exact']:.1f}"]
        for lvl in lv:
            r += [_p(c[lvl][p]) for p in ("none", "bts_d0", "bts_d2", "bts_d4")]
        rows.append(r)
    head = ["preset", "mode", "gen GPUs", "greedy step (s), exact"]
    for lvl in lv:
        head += [f"{POLICY_NAMES[p]}, {lvl}" for p in ("none", "bts_d0", "bts_d2", "bts_d4")]
    return ["Per configuration, relative to greedy (jittered: mean over the seeds):\n", table(rows, head) + "\n"]


def per_mode_part(q: dict) -> list[str]:
    """BTS depth 2 against greedy per mode (mean over the configurations of each mode, at each cost level), and
    which policy ``runtime.tag_policy: auto`` takes in each mode (``schedule.tag_policy.resolved_policy``), with
    whether the figures agree with it."""
    from digenrl.schedule import Mode
    from digenrl.schedule.tag_policy import auto_policy

    lv = [k for k in ("exact", "in_process", "runtime") if q["per_config"] and k in q["per_config"][0]]
    modes = sorted({c["mode"] for c in q["per_config"]})
    rows, agree = [], []
    for mode in modes:
        cs = [c for c in q["per_config"] if c["mode"] == mode]
        means = [_mean(c[k]["bts_d2"] for c in cs) for k in lv]
        faster = "bts" if _mean(means) < 0 else "greedy"
        auto = auto_policy(Mode(mode))
        agree.append((mode, auto, faster, _mean(means)))
        rel = [c[k]["bts_d2"] for c in cs for k in lv]
        split = (f"{sum(v < -q['tie_band'] for v in rel)} / {sum(v > q['tie_band'] for v in rel)} "
                 f"({_p(min(rel))} to {_p(max(rel))})")
        rows.append([mode, len(cs)] + [_p(m) for m in means] + [split, faster, auto])
    head = ["mode", "configurations"] + [f"BTS d2 vs greedy, {LEVEL_NAMES[k]}" for k in lv] + [
        "configuration x level: BTS d2 faster / slower (range)", "faster on average (mean of the levels)",
        "`auto` takes"]
    said = "; ".join(
        f"in `{m}` it takes {a}" + (f", the faster policy there ({_p(v)} for BTS d2 vs greedy, mean of the levels)"
                                    if a == f else f", although {f} was faster there ({_p(v)}): the figures no "
                                    "longer support this default")
        for m, a, f, v in agree)
    return ["**Per mode, and the default.** The same runs by mode (BTS depth 2 against greedy, mean over the "
            "mode's configurations and seeds). The default `runtime.tag_policy: auto` resolves per mode: "
            f"{said}. It is a choice per mode on average, not per configuration: where the range column crosses "
            "zero, the other policy is faster in some configurations (`runtime.tag_policy` sets one for a run, and "
            "`digenrl simulate --tag-policy` compares them on a config).\n", table(rows, head) + "\n"]


def agreement_part(a: dict) -> list[str]:
    rows = [[f"{NAMES.get(r['model'], r['model']).split('-')[0]} {r['testbed']}", r["mode"], r["bubbles"],
             r["choices"], _p(r["d0_eq_d2"], False), _p(r["d2_eq_d4"], False), _p(r["d2_eq_greedy"], False),
             _p(r["d2_skip"], False), f"{r['mean_k']['d2']:.2f} / {r['mean_k']['greedy']:.2f}",
             f"{r['nodes_mean']['d2']:.0f} / {r['nodes_max']['d4']}",
             f"{r['skip_greedy_delays']} / {r['skips']} ({r['skip_greedy_delay_mean_s']:+.1f} s)"] for r in a["rows"]]
    p = a["pooled"]
    return [
        f"Decisions on the same bubbles (`benchmarks/bts_agreement.py`, exact costs, {a['steps']} steps; a "
        "choice exists when an idle rank and a pending fragment do): over all "
        f"{p['choices']} choices depth 0 decides like depth 2 in {p['d0_eq_d2']:.0%}, depth 2 like depth 4 in "
        f"{p['d2_eq_d4']:.0%}, and depth 2 like greedy in {p['d2_eq_greedy']:.0%}; depth 2 skips "
        f"(k = 0) in {p['d2_skip']:.0%}. At {p['skip_greedy_delays']} of the {p['skips']} bubbles where it skips, "
        "greedy's k would have delayed the current step's commit by the exact prediction (no TAG afterwards).\n",
        table(rows, ["preset", "mode", "bubbles", "choices", "d0 = d2", "d2 = d4", "d2 = greedy", "d2 skips",
                     "mean k d2 / greedy", "nodes d2 mean / d4 max",
                     "skips where greedy's k delays the commit (mean change, s)"]) + "\n"]


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def findings(q: dict, a: dict | None) -> list[str]:
    s, rows = q["summary"], q["rows"]
    lv = [k for k in ("exact", "in_process", "runtime") if f"{k}/bts_d2" in s]

    def res(k: str, p: str) -> str:
        v = s[f"{k}/{p}"]
        return (f"{_p(v['mean_vs_greedy'])} ({v['wins']} / {v['ties']} / {v['losses']}; steady "
                f"{_p(v['steady_mean_vs_greedy'])})")

    d2 = "; ".join(f"{LEVEL_NAMES[k]} {res(k, 'bts_d2')}" for k in lv)
    depth = "; ".join(f"{LEVEL_NAMES[k]}: d0 {_p(s[k + '/bts_d0']['mean_vs_greedy'])}, d4 "
                      f"{_p(s[k + '/bts_d4']['mean_vs_greedy'])}" for k in lv)
    tags = ", ".join(f"{s[k + '/greedy']['tag_fragments_per_step']:.1f} vs {s[k + '/bts_d2']['tag_fragments_per_step']:.1f} "
                     f"({LEVEL_NAMES[k]})" for k in lv)
    means = [s[f"{k}/bts_d2"]["mean_vs_greedy"] for k in lv]
    if all(m < 0 for m in means):
        verdict = ("The search beats greedy on average at every level"
                   + (", by more under measured jitter than with exact costs" if min(means[1:], default=0) < means[0]
                      else "") + ".")
    else:
        verdict = "The search does not beat greedy at every level: " + ", ".join(
            LEVEL_NAMES[k] for k, m in zip(lv, means) if m >= 0) + " (mean step time)."
    none = [s[f"{k}/none"]["mean_vs_greedy"] for k in lv]
    spread = [c[k]["none"] for c in q["per_config"] for k in lv]
    tag = (f"TAG itself matters: without it the step is {_p(none[0])} slower than with the greedy rule (exact costs)"
           if none[0] > 0.01 else
           "On the planner's splits TAG changes little on average: without it the step is " + ", ".join(
               f"{_p(v)} ({LEVEL_NAMES[k]})" for k, v in zip(lv, none)) + " against the greedy rule, from "
           f"{_p(min(spread))} to {_p(max(spread))} per configuration and level, so inserting is as often wrong as "
           "right and the value of a TAG policy is in choosing where")
    vs_none = ", ".join(f"{_p((1 + s[f'{k}/bts_d2']['mean_vs_greedy']) / (1 + v) - 1)} ({LEVEL_NAMES[k]})"
                        for k, v in zip(lv, none))
    tag += f"; against no TAG at all depth 2 is {vs_none} (ratio of the mean relative step times)"
    out = [f"**Findings.** {tag}. BTS depth 2 against greedy (mean step time, wins / "
           f"ties / losses per run): {d2}. {verdict} Depth barely matters ({depth})."]
    why = ["**Why depth changes little (state, candidates, horizon).** The candidates at a bubble are "
           "k = 0..min(idle, pending) and the value is the end of the current step's commit; whether inserting now "
           "moves that commit is mostly decided by the depth-0 comparison (insert now, no TAG afterwards), and "
           "deeper levels only add later insertions, which rarely reverse the first choice"]
    if a:
        p = a["pooled"]
        why.append(f" (on the same bubbles depth 0 decides like depth 2 in {p['d0_eq_d2']:.0%} and depth 2 like "
                   f"depth 4 in {p['d2_eq_d4']:.0%})")
    why.append(". What the search adds over greedy is *skipping*: greedy never skips")
    if a:
        p = a["pooled"]
        why.append(f"; where depth 2 skips, greedy's k would have delayed the current commit by the exact "
                   f"prediction at {p['skip_greedy_delays']} of {p['skips']} bubbles"
                   + (" (at the others the search's quantized look-ahead preferred inserting later)"
                      if p["skip_greedy_delays"] < p["skips"] else ""))
    why.append(f". Jitter opens more bubbles and greedy fills them all (TAG fragments per step, greedy vs depth 2: "
               f"{tags}); the search inserts only where its exact check says the commit, a collective that waits "
               "for every rank's TAG fragment, does not move later.")
    jl = lv[-1]
    small = s.get("exact/bts_d2_small_ties")
    lost = [c for c in q["per_config"] if c[jl]["bts_d2"] > q["tie_band"]]
    lost_txt = ", ".join(f"{NAMES.get(c['model'], c['model']).split('-')[0]} {c['testbed']} {c['mode']} "
                         f"({_p(c[jl]['bts_d2'])})" for c in lost) or "none"
    hor = ["**Horizon.** The objective stops at the current step's commit, so it does not see that finishing a "
           "step's rollout earlier frees the generators for the next step (TCSS stale work in `full`). Equal "
           "predictions therefore go to the larger k"]
    if small:
        hor.append(f": with ties to k = 0 (the former rule, `bts_d2_small_ties`) depth 2 is "
                   f"{_p(small['mean_vs_greedy'])} vs greedy with exact costs ({small['wins']} / {small['ties']} / "
                   f"{small['losses']}), with ties to the larger k {_p(s['exact/bts_d2']['mean_vs_greedy'])} "
                   f"({s['exact/bts_d2']['wins']} / {s['exact/bts_d2']['ties']} / {s['exact/bts_d2']['losses']})")
    hor.append(f". Configurations where depth 2 is still slower than greedy on average under {LEVEL_NAMES[jl]} "
               f"(seeds {', '.join(map(str, q['seeds']))}): {lost_txt}")
    checks = q.get("rechecks")
    if checks is None:
        hor.append("; a multi-step objective (the next step's rollout in the value) is not implemented, and whether "
                   "it would close these gaps is not measured.")
    else:
        name = lambda r: f"{NAMES.get(r['model'], r['model']).split('-')[0]} {r['testbed']} {r['mode']}"  # noqa: E731
        real = [r for r in checks if r["mean_vs_greedy"] > 2 * r["sem"]]
        hor.append(". Every configuration and jittered level where depth 2 lost on average was simulated again with "
                   f"{checks[0]['seeds'] if checks else 0} seeds: " + ("; ".join(
                       f"{name(r)}, {LEVEL_NAMES.get(r['jitter'], r['jitter'])}: {_p(r['mean_vs_greedy'])} +- "
                       f"{r['sem']:.2%} ({r['wins']} / {r['ties']} / {r['losses']})" for r in checks) or "none")
                   + ". " + ("A loss larger than twice its standard error remains in " + ", ".join(
                       f"{name(r)} ({LEVEL_NAMES.get(r['jitter'], r['jitter'])})" for r in real)
                       + "; a multi-step objective (the next step's rollout in the value) is not implemented, and "
                       "whether it would close it is not measured." if real else
                       "None is larger than twice its standard error: those losses were the spread of the sweep's seeds."))
    d2rows = {k: [r for r in rows if r["policy"] == "bts_d2" and r["jitter"] == k and r["predictions"]] for k in lv}
    err = "; ".join(f"{LEVEL_NAMES[k]} {_mean(r['span_error_mean'] for r in d2rows[k]):.1%} (mean signed "
                    f"{_mean(r['span_error_bias'] for r in d2rows[k]):+.1%}; against the absolute commit time "
                    f"{_mean(r['commit_error_abs_time'] for r in d2rows[k]):.2%})" for k in lv)
    pred = [f"**Prediction error** of depth 2 against the predicted span: {err}. Positive: later than predicted. "
            "The error against the absolute commit time, the former statistic, understates it."]
    static = [r for r in rows if r["policy"] == "bts_d2_static" and r["jitter"] == lv[-1] and r["predictions"]]
    if static:
        pred.append(f" With the static profile (`bts_d2_static`, the medians for the whole run while a log-normal "
                    f"factor has a mean exp(sigma^2 / 2) above 1) it is {_mean(r['span_error_mean'] for r in static):.1%} "
                    f"(mean signed {_mean(r['span_error_bias'] for r in static):+.1%}) under {LEVEL_NAMES[lv[-1]]}, "
                    f"and its step time vs greedy {res(lv[-1], 'bts_d2_static')}.")
    return ["".join(out) + "\n", "".join(why) + "\n", "".join(hor) + "\n", "".join(pred) + "\n"]


ONLINE_NAMES = {"none": "no TAG", "greedy": "greedy", "static": "BTS d2, static profile",
                "online": "BTS d2, online (default)"}


def online_part(o: dict) -> list[str]:
    """A profile that misjudges the machine (``bts_online.json``): step time relative to BTS given the machine's
    costs, per misjudgement, level and policy."""
    s = o["summary"]
    lv = list(o["jitter_levels"])
    rows = []
    for name in o["misjudged"]:
        for lvl in lv:
            r = [name, LEVEL_NAMES.get(lvl, lvl)]
            for pol in ONLINE_NAMES:
                v = s[f"{name}/{lvl}/{pol}"]
                r.append(f"{_p(v['mean_vs_knowing'])} (max {_p(v['max'])}; {v['slower']} / {v['runs']})")
            rows.append(r)
    n_cfg = len({(r["model"], r["testbed"], r["mode"]) for r in o["rows"]})
    worst = {pol: max(s[f"{n}/exact/{pol}"]["max"] for n in o["misjudged"]) for pol in ("static", "online")}
    mean = {pol: _mean(s[f"{n}/{lvl}/{pol}"]["mean_vs_knowing"] for n in o["misjudged"] for lvl in lv)
            for pol in ONLINE_NAMES}
    found = [abs(v["online_max"] / v["true"] - 1) for sc in o["scales"].values() for v in sc.values()]
    return [
        "### A profile that misjudges the machine\n",
        "A run plans with a profile measured before it, and the machine it meets can differ per kind of work (on "
        "this CPU machine a run can be far off the calibration timed just before it, see the bias section). "
        "`benchmarks/bts_online.py` simulates the same "
        f"{n_cfg} configurations on a machine that is the preset's costs times known factors per action kind, with "
        "BTS depth 2 planning with the preset's costs as they are (*static profile*), refining them at every step "
        f"from the action times it sees (*online*, `tuning.bts.online`, decay {o['online_decay']} per step, the "
        "default), or given the machine's own costs (the oracle every number is relative to). "
        f"{o['steps']} steps; step 1 is planned with the profile alone by every policy; the jittered level adds "
        f"the runtime's measured per-op spread (seeds {o['seeds'][0]}-{o['seeds'][-1]}). Cells: mean step time "
        f"relative to the oracle (max over the runs; runs more than {o['tie_band']:.1%} slower / runs):\n",
        table(rows, ["machine vs profile", "costs", *ONLINE_NAMES.values()]) + "\n",
        f"With exact costs the online factors end within {max(found):.1e} of the machine's true ones in every "
        f"configuration, and the worst loss to the oracle falls from {_p(worst['static'])} with the static profile "
        f"to {_p(worst['online'])} online (step 1 included, which both plan with the profile alone). Averaged over "
        "the misjudgements and levels, the loss to the oracle is " + ", ".join(
            f"{_p(mean[p])} ({ONLINE_NAMES[p]})" for p in ONLINE_NAMES) + ".\n"]


def depth_part(d: dict, default_depth: int) -> list[str]:
    """Depth 0 / 4 against depth 2 (``bts_depth.json``), per configuration where anything differs, and the
    default it supports."""
    s = d["summary"]
    rows = []
    for r in d["rows"]:
        d0, d4 = r["rel_to_d2"]["d0"], r["rel_to_d2"]["d4"]
        if r["d0_ne_d2"] or r["d2_ne_d4"] or max(abs(d0["exact"]), abs(d0["jitter_mean"]), abs(d4["exact"]),
                                                 abs(d4["jitter_mean"])) > TIE:
            rows.append([f"{NAMES.get(r['model'], r['model']).split('-')[0]} {r['testbed']}", r["mode"], r["split"],
                         f"{r['gen_gpus']} / {r['train_gpus']}", r["choices"], r["d0_ne_d2"], r["d2_ne_d4"],
                         _p(d0["exact"]), f"{_p(d0['jitter_mean'])} ({d0.get('jitter_slower_seeds', '-')} / "
                         f"{d0.get('jitter_faster_seeds', '-')})", _p(d4["exact"]), _p(d4["jitter_mean"])])
    n, d0, d4 = s["configs"], s["d0"], s["d4"]
    models = sorted({r["model"] for r in d["rows"]})
    beds = sorted({r["testbed"] for r in d["rows"]})
    out = [
        "### Where depth matters, and the default\n",
        f"`benchmarks/bts_depth.py` looks for workloads where a deeper search changes anything: {n} configurations "
        f"({', '.join(NAMES.get(m, m).split('-')[0] for m in models)} on testbeds {', '.join(beds)}, the last "
        "heterogeneous one included; `gap_tsp_tag` and `full` (TCSS); the planner's split and a trainer-heavy one "
        f"with a quarter of the GPUs generating), {d['steps']} steps, exact costs and the runtime's measured "
        f"per-op jitter ({d['seeds']} seeds, BTS refining its profile online). On the {s['choices']} choices of the "
        f"depth-2 runs, fresh searches decide differently at depth 0 in {d0['different_decisions']} and at depth 4 "
        f"in {d4['different_decisions']}. Step time against depth 2: depth 0 is slower in {d0['exact_slower']} and "
        f"faster in {d0['exact_faster']} configurations with exact costs, slower in {d0['jitter_slower']} and "
        f"faster in {d0['jitter_faster']} under jitter (mean {_p(d0['jitter_mean'])}, worst "
        f"{_p(d0['jitter_max'])}); depth 4 is slower in {d4['exact_slower'] + d4['jitter_slower']} and faster in "
        f"{d4['exact_faster'] + d4['jitter_faster']} (exact and jittered together).\n"]
    if rows:
        out += ["Configurations where a depth differs from depth 2 (jittered: mean over the seeds, and seeds more "
                f"than {TIE:.1%} slower / faster):\n",
                table(rows, ["preset", "mode", "split", "gen / train GPUs", "choices", "d0 != d2", "d2 != d4",
                             "d0 vs d2, exact", "d0 vs d2, jittered", "d4 vs d2, exact", "d4 vs d2, jittered"]) + "\n"]
    gain4 = d4["exact_faster"] + d4["jitter_faster"] - d4["exact_slower"] - d4["jitter_slower"]
    verdict = f"Default `tuning.bts.depth: {default_depth}`. "
    if d0["exact_slower"] and d0["jitter_faster"]:
        verdict += (f"The measurements are mixed: with exact costs depth 0 decides differently in "
                    f"{d0['configs_with_a_different_decision']} configuration(s) and is slower there (up to "
                    f"{_p(d0['exact_max'])}), while under the measured jitter it is faster on average in "
                    f"{d0['jitter_faster']} configuration(s) (mean {_p(d0['jitter_mean'])}, best "
                    f"{_p(d0['jitter_min'])}) and slower in {d0['jitter_slower']}. That jitter is this CPU "
                    "machine's time-sharing noise, an upper bound of a GPU's, and per seed depth 0 wins some and "
                    "loses some (the table's counts), so the default is left at depth 2, which no configuration's exact costs beat; ")
    elif d0["exact_slower"] + d0["jitter_slower"] > d0["exact_faster"] + d0["jitter_faster"]:
        verdict += (f"Depth 0 is slower than depth 2 in {d0['exact_slower'] + d0['jitter_slower']} configuration "
                    f"results and faster in {d0['exact_faster'] + d0['jitter_faster']}: the look-ahead is kept; ")
    else:
        verdict += (f"Depth 0 is slower in {d0['exact_slower'] + d0['jitter_slower']} configuration results and "
                    f"faster in {d0['exact_faster'] + d0['jitter_faster']}; ")
    verdict += ("depth 4 gains nothing over depth 2 in any configuration, at about five times the search nodes "
                "per decision." if gain4 <= 0 else f"depth 4 gains in {gain4} configurations.")
    out.append(verdict + "\n")
    return out


TIE = 1e-3


def section(data: dict, default_depth: int | None = None) -> list[str]:
    """The section; ``default_depth``: the config's ``tuning.bts.depth`` default unless given."""
    if default_depth is None:
        from digenrl.config import BTSOptions

        default_depth = BTSOptions().depth
    q = data.get("quality")
    if not q or "summary" not in q or "per_config" not in q:
        return []
    L = ["## BTS decision quality\n"]
    if data.get("jitter"):
        L += jitter_part(data["jitter"], q.get("jitter_levels", {}))
    L += summary_part(q) + per_config_part(q) + per_mode_part(q)
    if data.get("agreement"):
        L += agreement_part(data["agreement"])
    L += findings(q, data.get("agreement"))
    if data.get("online"):
        L += online_part(data["online"])
    if data.get("depth"):
        L += depth_part(data["depth"], default_depth)
    return L
