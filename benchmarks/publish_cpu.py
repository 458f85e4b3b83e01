"""The three weight-publish paths of the Ray runtime, measured on this CPU machine against each other.

Setup: the pipeline benchmark's workload (``pipeline_cpu.WORKLOAD``: the digits task, P = 8, G = 8, T = 10,
fragments of 4, chunks of 8 x 2) in ``full`` mode (stale cap 0.25), 1 generator + 1 trainer rank with one thread
each, and a TinyDiT of ``--dim`` / ``--depth`` (random weights). Per path (``runtime.publish``):

* ``object_store``: trainer rank 0 copies its state and puts it in Ray's object store; the generators fetch it
  lazily, on their next call, so their load is inside their next generate span;
* ``broadcast``: a ``torch.distributed`` broadcast (gloo) from trainer rank 0 that the generators join;
* ``stream``: trainer rank 0 starts asynchronous sends of its shards (here: the whole state, one rank) and goes
  on training while the generators receive them.

Per run, over the steady-state window (first publish to last, as ``steady_step_time_s``), per step:

* ``trainer_publish_s``: seconds the trainer rank spent in publish spans (the time the publish held it);
* ``generator_publish_s``: seconds the generator spent in publish spans (receiving);
* ``step_time_s`` and ``efficiency`` as in ``pipeline_cpu.py``.

Each path runs ``--rounds`` times, interleaved with the others; a row is the mean over its rounds. The
difference of step times is small next to this VM's drift (the publish of a TinyDiT is ~1% of a step); the held
times are the direct measurement.

Run: ``python benchmarks/publish_cpu.py [--rounds 3] [--steps 6] [--dim 192] [--depth 6] [--out PATH]``;
``--table RESULTS`` prints the table and paragraph (docs/benchmarks.md) from a results file.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_cpu import MODEL, WORKLOAD, load_range  # noqa: E402

PATHS = ("object_store", "broadcast", "stream")
PER_RUN = ("step_time_s", "efficiency", "trainer_publish_s", "generator_publish_s", "trainer_commit_s")


def held_per_step(spans, kind: str, pool: str, lo: float, hi: float, steps: int) -> float:
    """Seconds per step that the workers of ``pool`` (``Span.pool``: generator / trainer) spent in ``kind`` spans
    inside ``[lo, hi]`` (the steady window)."""
    total = sum(max(0.0, min(s.end, hi) - max(s.start, lo)) for s in spans if s.kind == kind and s.pool == pool)
    return total / steps


def publish_ends(spans) -> list[float]:
    """The end of each version's publish, in order: the last of its spans (``publish vK``) to end (a stream's
    senders end before the generators, which end when they hold the version)."""
    ends: dict[str, float] = {}
    for x in spans:
        if x.kind == "publish":
            ends[x.label] = max(ends.get(x.label, x.end), x.end)
    return sorted(ends.values())


def one_run(base: list[str], path: str, run_dir: Path, log) -> dict:
    from digenrl.config import load_config
    from digenrl.observe.trace import read_chrome_trace
    from digenrl.runtime.driver import run_training

    load = os.getloadavg()[0]  # before the run: what else was running (the run itself adds ~1.5 on 2 cores)
    cfg = load_config(None, base + ["runtime.mode=full", "runtime.trainers=1", "runtime.generators=1",
                                    f"runtime.publish={path}", f"run_dir={run_dir}"])
    s = run_training(cfg, ray=True)
    spans = read_chrome_trace(run_dir / "trace.json")
    pubs = publish_ends(spans)  # the steady window: the first step's publish to the last step's
    lo, hi, n = pubs[0], pubs[-1], len(pubs) - 1
    row = {"step_time_s": s["steady_step_time_s"], "efficiency": s["steady_efficiency"],
           "trainer_publish_s": held_per_step(spans, "publish", "trainer", lo, hi, n),
           "generator_publish_s": held_per_step(spans, "publish", "generator", lo, hi, n),
           "trainer_commit_s": held_per_step(spans, "commit", "trainer", lo, hi, n),
           "publishes_in_window": n, "audit_violations": len(s["audit_violations"]), "load_avg_1m_before": load}
    log(f"{path:12s} step {row['step_time_s']:.3f} s  efficiency {row['efficiency']:.2f}  trainer held "
        f"{row['trainer_publish_s'] * 1e3:.1f} ms/step  generator held {row['generator_publish_s'] * 1e3:.1f} ms/step")
    return row


def summarize(path: str, runs: list[dict], state_bytes: int) -> dict:
    row = {"publish": path, **{k: statistics.fmean(r[k] for r in runs) for k in PER_RUN}}
    row["round_step_times_s"] = [r["step_time_s"] for r in runs]
    row["round_trainer_publish_s"] = [r["trainer_publish_s"] for r in runs]
    row["round_load_avg_1m_before"] = [r["load_avg_1m_before"] for r in runs]
    row["audit_violations"] = sum(r["audit_violations"] for r in runs)
    row["rounds"] = len(runs)
    row["state_bytes"] = state_bytes
    return row


def run_paths(paths, steps: int, rounds: int, work: Path, log, dim: int, depth: int) -> list[dict]:
    import torch

    from digenrl.models.tiny_dit import TinyDiTConfig, TinyDiTPolicy

    torch.manual_seed(0)
    model = work / "model.safetensors"
    policy = TinyDiTPolicy(TinyDiTConfig(**{**MODEL, "dim": dim, "depth": depth}))
    policy.save(model)
    state_bytes = sum(v.numel() * v.element_size() for v in policy.trainable_state_dict().values())
    base = [f"model.path={model}", f"steps={steps}", *WORKLOAD]
    runs: dict[str, list[dict]] = {p: [] for p in paths}
    for r in range(rounds):  # interleaved: the machine's speed drifts over minutes
        for p in paths:
            runs[p].append(one_run(base, p, work / f"{p}_{r}", log))
        log(f"  (round {r + 1} of {rounds})")
    return [summarize(p, runs[p], state_bytes) for p in paths]


def markdown(rows: list[dict]) -> str:
    """The table and the sentence under it (docs/benchmarks.md); every number is a value of the results file."""
    out = ["| publish | step (s) | per round (s) | pipeline efficiency | trainer held per step (ms) | "
           "generator held per step (ms) | trainer commit per step (ms) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        per = " / ".join(f"{x:.2f}" for x in r["round_step_times_s"])
        out.append(f"| `{r['publish']}` | {r['step_time_s']:.3f} | {per} | {r['efficiency']:.2f} | "
                   f"{r['trainer_publish_s'] * 1e3:.1f} | {r['generator_publish_s'] * 1e3:.1f} | "
                   f"{r['trainer_commit_s'] * 1e3:.1f} |")
    by = {r["publish"]: r for r in rows}
    text = (f"Weights of {rows[0]['state_bytes'] / 2**20:.1f} MiB, mean of {rows[0]['rounds']} interleaved runs per "
            "path" + load_words(rows) + ".")
    if {"object_store", "stream"} <= by.keys():
        o, s = by["object_store"], by["stream"]
        text += (f" The streamed publish holds the trainer {s['trainer_publish_s'] * 1e3:.1f} ms per step against "
                 f"the object store's {o['trainer_publish_s'] * 1e3:.1f} ms; its step time is "
                 f"{s['step_time_s'] / o['step_time_s'] - 1:+.1%} against the object store's "
                 f"(the runs of one path spread by {max_spread(rows):.0%}).")
    return "\n".join(out + ["", text])


def load_words(rows: list[dict]) -> str:
    """The 1-min load averages before the runs (results files written before the field have none)."""
    loads = load_range(rows)
    return "" if loads is None else f" (1-min load average {loads[0]:.1f}-{loads[1]:.1f} before each run)"


def max_spread(rows: list[dict]) -> float:
    return max(max(r["round_step_times_s"]) / min(r["round_step_times_s"]) - 1 for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    ap.add_argument("--dim", type=int, default=MODEL["dim"])
    ap.add_argument("--depth", type=int, default=MODEL["depth"])
    ap.add_argument("--out", default=None, help="write the rows here (benchmarks/results/publish_cpu.json)")
    ap.add_argument("--table", default=None, metavar="RESULTS", help="print the table of a results file (docs/benchmarks.md)")
    args = ap.parse_args(argv)
    if args.table:
        print(markdown(json.loads(Path(args.table).read_text())))
        return 0
    if args.steps < 3:
        ap.error(f"--steps: at least 3 for a steady window (got {args.steps})")
    logging.basicConfig(level=logging.WARNING)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        rows = run_paths(args.paths, args.steps, args.rounds, Path(tmp), log, args.dim, args.depth)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=1))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
