"""Per-operation duration spread measured on runtime traces: the jitter ``benchmarks/bts_quality.py`` simulates.

Input: Chrome traces (``trace.json``) written by the Ray runtime (``digenrl train``; spans in wall seconds from
launch to completion as the scheduler sees them, ``observe.trace``). Spans are grouped by kind and shape:
``generate`` (generator fragment), ``tag`` (fragment generated on a trainer rank), ``train`` (per chunk size in
cells), ``commit``, ``publish``. Per group, with d the durations and m their median:

* ``sigma_total``  = std of log(d / m): the whole spread;
* ``sigma_fast``   = std of log(d) - log(rolling median of the same group's 21 neighbouring spans, in trace
  order): the spread left after slow drift (machine load changing over minutes), i.e. the part an
  independent per-op log-normal factor (``sim.executor``'s jitter model) represents;
* ``ac1``          = lag-1 autocorrelation of log(d / m) in trace order (0: independent draws).

Per kind the groups are pooled (weighted by sample count); ``kinds`` holds the simulator's jitter per action
kind (``generate`` takes the generator and TAG fragments together). Source of the committed numbers: the
TCSS-curve runs of ``scripts/tcss_curves.py`` (tiny DiT, digits task, 1 generator + 1 trainer rank, 1 thread
each, 200 steps, on this shared 2-core CPU machine), so they measure CPU time-sharing noise, not GPU kernel
variance; a GPU run's trace can be fed the same way.

``--measure N`` adds an in-process measurement (``in_process``): the ops of the CPU pipeline benchmark's
workload (``pipeline_cpu.WORKLOAD``, demo TinyDiT, 1 thread) timed N times back to back on one trainer worker
built in this process (no Ray), with the worker-side timing code of ``runtime.timing`` (each sample kept, not
only the median): ``generate`` = sampling a fragment of 4, ``train`` = forward + backward of 8 and 16 cells,
``commit`` = the optimizer's work (one rank: no all-reduce), ``publish`` = copy + serialise + load of the
weights. Its sigma is the std of log(d / median) per op (a few seconds of samples: no drift to remove).

Run: ``python benchmarks/op_jitter.py [TRACE.json ...] [--measure 30] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

KIND_OF = {"generate": "generate", "tag": "generate", "train": "train", "commit": "commit", "publish": "publish"}
WINDOW = 21


def spans_of(path: Path) -> dict[tuple[str, str], list[float]]:
    """(kind, shape) -> durations in trace order (seconds)."""
    data = json.loads(path.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    out: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e.get("ph") != "X" or e.get("name") not in KIND_OF or not e.get("dur", 0) > 0:
            continue
        words = e.get("args", {}).get("label", "").split()
        shape = next((w for w in words if w.startswith("x") and w[1:].isdigit()), None)  # fragment "x4"
        if shape is None and "cells" in words:
            shape = words[words.index("cells") - 1] + " cells"
        out[(e["name"], shape or "")].append((e["ts"], e["dur"] / 1e6))
    return {k: [d for _, d in sorted(v)] for k, v in out.items()}


def spread(ds: list[float]) -> dict:
    logs = [math.log(d) for d in ds]
    m = statistics.median(logs)
    dev = [x - m for x in logs]
    half = WINDOW // 2
    fast = [logs[i] - statistics.median(logs[max(0, i - half):i + half + 1]) for i in range(len(logs))]
    var = statistics.pvariance(dev)
    ac1 = (sum(dev[i] * dev[i + 1] for i in range(len(dev) - 1)) / (len(dev) - 1) / var) if var > 0 else 0.0
    return {"n": len(ds), "median_s": math.exp(m), "sigma_total": statistics.pstdev(dev),
            "sigma_fast": statistics.pstdev(fast), "ac1": ac1}


def pooled(groups: list[dict], key: str) -> float:
    n = sum(g["n"] for g in groups)
    return math.sqrt(sum(g["n"] * g[key] ** 2 for g in groups) / n)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="*", help="runtime trace.json files")
    ap.add_argument("--measure", type=int, default=0, help="also time the ops in-process this many times")
    ap.add_argument("--min-samples", type=int, default=20, help="groups with fewer spans are left out")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "op_jitter.json"))
    args = ap.parse_args(argv)
    per_trace, by_kind = [], defaultdict(list)
    for t in args.traces:
        p = Path(t)
        if not p.is_file():
            print(f"op_jitter: error: trace {t}: no such file", file=sys.stderr)
            return 2
        groups = []
        for (name, shape), ds in sorted(spans_of(p).items()):
            if len(ds) >= args.min_samples:
                g = {"span": name, "shape": shape, **spread(ds)}
                groups.append(g)
                by_kind[KIND_OF[name]].append(g)
        cfg = p.parent / "config.yaml"
        per_trace.append({"trace": f"{p.parent.name}/{p.name}", "groups": groups,
                          "config": _config_note(cfg) if cfg.exists() else None})
    if args.traces and not by_kind:
        print("op_jitter: error: no spans with enough samples in the traces", file=sys.stderr)
        return 2
    if not args.traces and args.measure < 2:
        print("op_jitter: error: give runtime traces and/or --measure N (N >= 2)", file=sys.stderr)
        return 2
    kinds = {k: {"sigma_fast": pooled(g, "sigma_fast"), "sigma_total": pooled(g, "sigma_total"),
                 "ac1_mean": statistics.fmean(x["ac1"] for x in g), "n": sum(x["n"] for x in g)}
             for k, g in sorted(by_kind.items())}
    res = {"source": "runtime traces (Chrome trace JSON of `digenrl train`), see benchmarks/op_jitter.py",
           "window": WINDOW, "kinds": kinds, "traces": per_trace}
    for k, v in kinds.items():
        print(f"traces     {k:9s} n={v['n']:6d} sigma_fast={v['sigma_fast']:.3f} sigma_total={v['sigma_total']:.3f} "
              f"ac1={v['ac1_mean']:.2f}")
    if args.measure >= 2:
        res["in_process"] = measure(args.measure)
        for k, v in res["in_process"]["kinds"].items():
            print(f"in-process {k:9s} n={v['n']:6d} sigma={v['sigma']:.3f} median={v['median_s'] * 1e3:.1f} ms")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(f"wrote {out}")
    return 0


def measure(repeats: int) -> dict:
    """The in-process measurement of the module docstring."""
    import os

    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from pipeline_cpu import WORKLOAD

    from digenrl.config import load_config
    from digenrl.runtime.timing import Calibration
    from digenrl.runtime.trainer import TrainerWorker

    torch.set_num_threads(1)
    cfg = load_config(None, WORKLOAD + ["runtime.mode=gap_tsp_tag"])
    worker = TrainerWorker("t0", cfg.model_dump(mode="json"), 0)
    # runtime.timing's ops (sample, decode, reward, transfer of 4; train 8, train 16; optimizer, publish), each
    # timed ``repeats`` times back to back after one warm-up, every sample kept
    cal = Calibration(worker, worker.policy, [4], [8, 16], trainer=True)
    samples: list[list[float]] = []
    for block in cal.keys():
        for key in block:
            cal.run(key)
            samples.append([cal.run(key) for _ in range(repeats)])
    cal.end()
    names = ["generate", None, None, None, "train", "train", "commit", "publish"]
    by: dict[str, list[dict]] = defaultdict(list)
    for name, ts in zip(names, samples):
        if name:
            logs = [math.log(t) for t in ts]
            m = statistics.median(logs)
            by[name].append({"n": len(ts), "median_s": math.exp(m),
                             "sigma": statistics.pstdev([x - m for x in logs])})
    kinds = {k: {"sigma": pooled(g, "sigma"), "n": sum(x["n"] for x in g), "median_s": g[0]["median_s"]}
             for k, g in by.items()}
    return {"repeats": repeats, "load_average_1min": os.getloadavg()[0], "kinds": kinds}


def _config_note(path: Path) -> dict:
    import yaml

    c = yaml.safe_load(path.read_text())
    rt, tr = c.get("runtime", {}), c.get("train", {})
    return {"mode": rt.get("mode"), "generators": rt.get("generators"), "trainers": rt.get("trainers"),
            "fragment_size": rt.get("fragment_size"), "threads_per_worker": rt.get("threads_per_worker"),
            "steps": c.get("steps"), "model": c.get("model", {}).get("kind") or c.get("model", {}).get("path"),
            "generations": tr.get("generations"), "prompts": tr.get("prompts_per_step")}


if __name__ == "__main__":
    raise SystemExit(main())
