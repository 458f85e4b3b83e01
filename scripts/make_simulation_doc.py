"""Generate docs/simulation.md, its figures and its results file from the simulator (``digenrl.sim``).

    python scripts/make_simulation_doc.py                 # all runs (~35 min on 2 cores), then the page
    python scripts/make_simulation_doc.py --reuse         # re-render from the saved results file
    python scripts/make_simulation_doc.py --out /tmp/x/simulation.md   # page, figures/ and results under /tmp/x

Everything goes where ``--out`` says: the page at OUT, figures and ``simulation_results.json`` in
``OUT's folder/figures``. Every number of the page (tables and prose) is read from the results file, except
the BTS section's and the anchors' (``simdoc_anchors``, ``benchmarks/results/anchors.json``), read from the
benchmarks' results in ``benchmarks/results`` at every render, so ``--reuse`` regenerates it after ``benchmarks/bts_quality.py`` without re-running the simulations.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from simdoc_algorithms import section as algorithms_section  # noqa: E402
from simdoc_anchors import section as anchors_section  # noqa: E402
from simdoc_bias import section as bias_section  # noqa: E402
from simdoc_hybrid import section as hybrid_section  # noqa: E402
from simdoc_bts import load as load_bts  # noqa: E402
from simdoc_bts import section as bts_section  # noqa: E402
from simdoc_prose import MECH, render  # noqa: E402
from simdoc_render import NAMES, PUBLISHED_ABLATION, PUBLISHED_COLOC, canonical_models, row  # noqa: E402

RESULTS = "simulation_results.json"


def bar_figures(res: dict, figdir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["+GAP", "+TSP", "+TAG", "+TCSS"]
    fig, ax = plt.subplots(figsize=(11, 4.2))
    configs = [c for c in res["runs"] if c["model"] in ("hunyuan_video", "wan")]
    width = 0.8 / len(configs)
    for i, m in enumerate(MECH):
        lo, hi = PUBLISHED_ABLATION[m]
        ax.add_patch(plt.Rectangle((i - 0.45, lo), 0.9, hi - lo, color="#DDDDDD", zorder=0))
    for j, c in enumerate(configs):
        ys = [row(c["rows"], m)["speedup_vs_naive"] for m in MECH]
        ax.bar([i - 0.4 + (j + 0.5) * width for i in range(len(MECH))], ys, width,
               label=f"{NAMES[c['model']].split('-')[0]} {c['testbed']} T={c['T']}")
    ax.axhline(1.0, color="black", lw=0.6)
    ax.set_xticks(range(len(MECH)), labels)
    ax.set_ylabel("cumulative speedup over naive")
    ax.set_title("Ablation (grey boxes: published HunyuanVideo ranges)")
    ax.legend(fontsize=6, ncol=3, loc="upper left")
    fig.savefig(figdir / "ablation.png", dpi=110, bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(11, 4.2))
    cs = [c for c in res["runs"] if c["T"] == 20]
    for i, c in enumerate(cs):
        on = row(c["rows"], "gap_tsp_tag")["speedup_vs_colocated"]
        tc = row(c["rows"], "full")["speedup_vs_colocated"]
        ax.bar(i - 0.2, on, 0.4, color="#55A868", label="gap_tsp_tag (on-policy)" if i == 0 else None)
        ax.bar(i + 0.2, tc, 0.4, color="#4C72B0", label="full (TCSS)" if i == 0 else None)
        for k, (x0, col) in enumerate(((i - 0.4, "#55A868"), (i, "#4C72B0"))):
            pub = PUBLISHED_COLOC[c["model"]][k]
            if pub:
                for v in pub:
                    ax.plot([x0, x0 + 0.4], [v, v], color=col, lw=0.8, ls="--")
    ax.axhline(1.0, color="black", lw=0.6)
    ax.set_xticks(range(len(cs)), [f"{NAMES[c['model']].split('-')[0]}\n{c['testbed']}" for c in cs], fontsize=8)
    ax.set_ylabel("speedup over colocated")
    ax.set_title("DigenRL vs colocation, T = 20 (dashed: published ranges)")
    ax.legend(fontsize=8)
    fig.savefig(figdir / "vs_colocated.png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def gantts(figdir: Path, steps: int = 2) -> list[tuple[str, str]]:
    from digenrl.observe.gantt import plot_gantt
    from simdoc_runs import MODES, run_mode, setup

    figs = []
    for tb, mode in [("A", m) for m in MODES] + [("A+C", "full")]:
        r = run_mode(setup("hunyuan", tb, steps), mode, record=True)
        name = f"gantt_hunyuan_{tb.replace('+', '')}_{mode}.png"
        title = (f"{NAMES['hunyuan_video']}, {mode}, testbed {tb}, "
                 + (f"{r.n_train} colocated GPUs" if mode == "colocated" else f"{r.n_gen}+{r.n_train} GPUs")
                 + (f" ({r.note})" if r.note else "") + f", {steps} steps")
        plot_gantt(r.result.spans, figdir / name, title, r.result.workers)
        figs.append((name, title))
    return figs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--reuse", action="store_true", help="re-render from the saved results file next to --out")
    ap.add_argument("--no-gantt", action="store_true", help="skip the Gantt charts (faster)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "simulation.md"))
    args = ap.parse_args(argv)
    if args.steps < 1:
        print(f"make_simulation_doc: error: --steps must be >= 1 (got {args.steps})", file=sys.stderr)
        return 2
    out = Path(args.out)
    figdir = out.parent / "figures"
    cache = figdir / RESULTS
    if args.reuse and not cache.exists():
        print(f"make_simulation_doc: error: --reuse: no results file {cache}", file=sys.stderr)
        return 2
    figdir.mkdir(parents=True, exist_ok=True)
    if args.reuse:
        res = json.loads(cache.read_text())
    else:
        from simdoc_runs import run_all

        t0 = time.perf_counter()
        res = run_all(args.steps, log=lambda s: print(s, flush=True))
        res["gantts"] = [] if args.no_gantt else gantts(figdir)
        print(f"runs done [{time.perf_counter() - t0:.0f}s]")
        cache.write_text(json.dumps(res, indent=1))
    res = canonical_models(res)  # the page names each model by the registry's spelling
    bts = bts_section(load_bts(ROOT / "benchmarks" / "results"))  # read fresh: not part of the cached runs
    bar_figures(res, figdir)
    bias = bias_section(ROOT / "benchmarks" / "results")  # measured runs, read fresh as well
    algos = algorithms_section(ROOT / "benchmarks" / "results")  # benchmarks/algorithm_costs.py, read fresh
    algos += hybrid_section(ROOT / "benchmarks" / "results")  # benchmarks/hybrid_sharding.py, read fresh
    bias += anchors_section(ROOT / "benchmarks" / "results")  # benchmarks/anchors.py, read fresh
    out.write_text(render(res, [tuple(f) for f in res.get("gantts", [])], bts, bias, algos))
    print(f"wrote {out}, figures and {RESULTS} in {figdir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
