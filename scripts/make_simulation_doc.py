"""Generate docs/simulation.md and its figures from the simulator (``digenrl.sim``).

    python scripts/make_simulation_doc.py            # all runs (~2-4 min on 2 cores), then the page
    python scripts/make_simulation_doc.py --reuse    # re-render from docs/figures/simulation_results.json

Nothing here is tuned: every number comes from the presets (model cards, datasheets) through the roofline
cost model and the same scheduler the runtime drives. The published ranges are printed next to the results
for comparison only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from digenrl.observe.gantt import plot_gantt  # noqa: E402
from digenrl.schedule import MODES as ALL_MODES  # noqa: E402
from digenrl.sim.cli import rows_of, run_modes  # noqa: E402
from digenrl.sim.planner import Scenario, run_mode  # noqa: E402
from digenrl.sim.presets import MODELS, TESTBEDS, WORKLOADS  # noqa: E402
from digenrl.sim.roofline import InfeasibleError, RooflineCost  # noqa: E402

MODES = list(ALL_MODES)
ABLATION = [("hunyuan", "A"), ("hunyuan", "B"), ("hunyuan", "C"), ("wan", "B"), ("wan", "C")]
COLOC = [("hunyuan", tb) for tb in "ABC"] + [("wan", "B"), ("wan", "C")] + [("flux", tb) for tb in "ABC"]
HETERO = ["hunyuan", "wan", "flux"]
T_VALUES = [20, 30, 40]
PUBLISHED_ABLATION = {"gap": (1.52, 1.84), "gap_tsp": (1.62, 2.14), "gap_tsp_tag": (2.28, 3.05),
                      "full": (2.49, 3.34)}
PUBLISHED_COLOC = {"hunyuan": ((1.04, 1.37), (1.13, 1.49)), "wan": ((1.13, 1.34), (1.21, 1.45)),
                   "flux": ((1.06, 1.21), None)}
PUBLISHED_HETERO = (1.46, 1.85)


def setup(model: str, tb: str, steps: int, T: int = 20) -> Scenario:
    w = replace(WORKLOADS[model], sampling_steps=T)
    return Scenario(MODELS[model], TESTBEDS[tb], w, TESTBEDS[tb].total, steps=steps)


def run_all(steps: int) -> dict:
    out: dict = {"steps": steps, "ablation": [], "coloc": [], "hetero": [], "costs": [], "bts": []}
    t0 = time.perf_counter()
    for model, tb in ABLATION:
        for T in T_VALUES:
            rows = rows_of(run_modes(setup(model, tb, steps, T), MODES, None), MODES)
            out["ablation"].append({"model": model, "testbed": tb, "T": T, "rows": rows})
            print(f"ablation {model} {tb} T={T} [{time.perf_counter() - t0:.0f}s]", flush=True)
    for model, tb in COLOC:
        rows = rows_of(run_modes(setup(model, tb, steps), MODES, None), MODES)
        out["coloc"].append({"model": model, "testbed": tb, "T": 20, "rows": rows})
    for model in HETERO:
        rows = rows_of(run_modes(setup(model, "A+C", steps), MODES, None), MODES)
        out["hetero"].append({"model": model, "testbed": "A+C", "T": 20, "rows": rows})
    print(f"colocated + heterogeneous done [{time.perf_counter() - t0:.0f}s]", flush=True)
    for model in ("flux", "wan", "hunyuan", "qwen-image"):
        for tb in "ABC":
            n = TESTBEDS[tb].total
            try:
                d = RooflineCost(MODELS[model], WORKLOADS[model], TESTBEDS[tb], n // 3, n - n // 3).describe()
            except InfeasibleError as e:
                d = {"infeasible": str(e)}
            out["costs"].append({"model": model, "testbed": tb, **d})
    out["jitter"] = []
    for model, tb in (("hunyuan", "A"), ("flux", "B")):
        base = next(c for c in out["coloc"] if (c["model"], c["testbed"]) == (model, tb))["rows"]
        split = {r["mode"]: (r["gen_gpus"] if r["mode"] != "colocated" else None) for r in base}
        for sigma in (0.0, 0.1, 0.2, 0.3):
            st = {m: run_mode(setup(model, tb, 10), m, split[m], jitter=sigma, seed=3).result.step_time
                  for m in ("colocated", "naive", "gap_tsp", "gap_tsp_tag", "full")}
            out["jitter"].append({"model": model, "testbed": tb, "sigma": sigma,
                                  "vs_colocated": {m: st["colocated"] / v for m, v in st.items()}})
    for mode in ("gap_tsp_tag", "full"):
        r = run_mode(setup("hunyuan", "A", steps), mode, jitter=0.05, seed=1)
        out["bts"].append({"mode": mode, "jitter": 0.05, **r.result.bts})
        r = run_mode(setup("hunyuan", "A", steps), mode)
        out["bts"].append({"mode": mode, "jitter": 0.0, **r.result.bts})
    return out


def gantts(figdir: Path, steps: int = 2) -> list[tuple[str, str]]:
    figs = []
    cases = [("hunyuan", "A", m) for m in MODES] + [("hunyuan", "A+C", "full")]
    for model, tb, mode in cases:
        s = setup(model, tb, steps)
        run = run_mode(s, mode, record=True)
        name = f"gantt_{model}_{tb.replace('+', '')}_{mode}.png"
        title = (f"{MODELS[model].name}, {mode}, testbed {tb}, "
                 + (f"{run.n_train} colocated GPUs" if mode == "colocated" else f"{run.n_gen}+{run.n_train} GPUs")
                 + (f" ({run.note})" if run.note else "") + f", {steps} steps")
        plot_gantt(run.result.spans, figdir / name, title, run.result.workers)
        figs.append((name, title))
    return figs


def speed(rows: list[dict], mode: str, key: str = "speedup_vs_naive") -> float:
    return next(r[key] for r in rows if r["mode"] == mode)


def bar_figures(res: dict, figdir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mech = ["gap", "gap_tsp", "gap_tsp_tag", "full"]
    labels = ["+GAP", "+TSP", "+TAG", "+TCSS"]
    fig, ax = plt.subplots(figsize=(11, 4.2))
    configs = res["ablation"]
    width = 0.8 / len(configs)
    for i, m in enumerate(mech):
        lo, hi = PUBLISHED_ABLATION[m]
        ax.add_patch(plt.Rectangle((i - 0.45, lo), 0.9, hi - lo, color="#DDDDDD", zorder=0))
    for j, c in enumerate(configs):
        ys = [speed(c["rows"], m) for m in mech]
        ax.bar([i - 0.4 + (j + 0.5) * width for i in range(len(mech))], ys, width,
               label=f"{MODELS[c['model']].name.split('-')[0]} {c['testbed']} T={c['T']}")
    ax.axhline(1.0, color="black", lw=0.6)
    ax.set_xticks(range(len(mech)), labels)
    ax.set_ylabel("cumulative speedup over naive")
    ax.set_title("Ablation (grey boxes: published HunyuanVideo ranges)")
    ax.legend(fontsize=6, ncol=3, loc="upper left")
    fig.savefig(figdir / "ablation.png", dpi=110, bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(11, 4.2))
    xs, names = [], []
    for i, c in enumerate(res["coloc"]):
        on, tc = speed(c["rows"], "gap_tsp_tag", "speedup_vs_colocated"), speed(c["rows"], "full",
                                                                                 "speedup_vs_colocated")
        ax.bar(i - 0.2, on, 0.4, color="#55A868", label="gap_tsp_tag (on-policy)" if i == 0 else None)
        ax.bar(i + 0.2, tc, 0.4, color="#4C72B0", label="full (TCSS)" if i == 0 else None)
        lo, hi = PUBLISHED_COLOC[c["model"]][0]
        ax.plot([i - 0.4, i], [lo, lo], color="#55A868", lw=0.8, ls="--")
        ax.plot([i - 0.4, i], [hi, hi], color="#55A868", lw=0.8, ls="--")
        if PUBLISHED_COLOC[c["model"]][1]:
            lo, hi = PUBLISHED_COLOC[c["model"]][1]
            ax.plot([i, i + 0.4], [lo, lo], color="#4C72B0", lw=0.8, ls="--")
            ax.plot([i, i + 0.4], [hi, hi], color="#4C72B0", lw=0.8, ls="--")
        xs.append(i)
        names.append(f"{MODELS[c['model']].name.split('-')[0]}\n{c['testbed']}")
    ax.axhline(1.0, color="black", lw=0.6)
    ax.set_xticks(xs, names, fontsize=8)
    ax.set_ylabel("speedup over colocated")
    ax.set_title("DigenRL vs colocation, T = 20 (dashed: published ranges)")
    ax.legend(fontsize=8)
    fig.savefig(figdir / "vs_colocated.png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def table(rows: list[list], header: list[str]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return "\n".join(out)


def fmt(x: float) -> str:
    return f"{x:.2f}x"


def render(res: dict, figs: list[tuple[str, str]], out: Path) -> None:
    L: list[str] = []
    add = L.append
    add("# Simulated speedups of DigenRL's execution modes\n")
    add("Generated by `scripts/make_simulation_doc.py` (do not edit by hand) from `digenrl.sim`: the scheduler "
        "of `digenrl.schedule` (the one the Ray runtime drives) executed in virtual time with the analytic "
        "roofline cost model of `digenrl.sim.roofline`. Every input is a hardware or model fact (datasheets, "
        "model cards; sources in `src/digenrl/sim/presets.py`); nothing was fitted to the published speedups, "
        "which are shown only for comparison. Reproduce a row with e.g. `digenrl simulate --model hunyuan "
        f"--testbed A --steps {res['steps']}`.\n")
    add("## Scenario\n")
    add("* **Workloads** (Flow-GRPO / DanceGRPO-style): images (FLUX.1-dev, Qwen-Image) 16 prompts x 16 "
        "generations at 512x512; videos (HunyuanVideo, Wan2.1) 8 prompts x 12 generations of 33 frames at "
        "480p. T = 20 sampling steps unless stated (ablation: 20/30/40), timestep fraction 0.6 (S = int(0.6 T) "
        f"trained timesteps, as Flow-GRPO computes it), {res['steps']} optimizer steps per run; step time = "
        "makespan / steps (the first step's pipeline fill included). TCSS cap `max_stale_fraction` = 0.5.")
    add("* **Training**: full-parameter fine-tuning, ZeRO-3/FSDP over the trainer pool, activation "
        "checkpointing, gradients accumulated unsharded under `no_sync` until the commit; prompt embeddings "
        "cached. Generators hold a bf16 replica. CFG doubles forwards for Wan2.1 and Qwen-Image (in sampling "
        "and in the training forward); FLUX.1-dev and HunyuanVideo are guidance-distilled.")
    add("* **Testbeds**: A = 32 x L40S 48 GB, 200 Gb/s; B = 32 x H100 SXM 80 GB, 400 Gb/s; C = 16 x H20 96 GB, "
        "200 Gb/s HDR IB; A+C = both, each pool on one kind (the planner tries both assignments). Every "
        "disaggregated mode gets its own best generator/trainer split (searched); fragment sizes and TSP chunk "
        "shapes are chosen from the cost model (`digenrl.sim.planner`).")
    add("* **Efficiency**: achievable share of dense BF16 peak = 0.6 x tokens / (tokens + 512) per forward; "
        "VAE and reward at 0.35; 3 ms per forward of launch overhead.\n")
    rows = []
    for c in res["costs"]:
        if "infeasible" in c:
            rows.append([MODELS[c["model"]].name, c["testbed"], "does not fit: " + c["infeasible"], "", "", "", ""])
        else:
            rows.append([MODELS[c["model"]].name, c["testbed"], f"{c['fwd_tflop']:.0f}", f"{c['gen_s_per_sample']:.1f}",
                         f"{c['train_s_per_cell']:.2f}", int(c["max_cells"]), "yes" if c["inference_copy_fits"] else "no"])
    add("Derived costs (trainer pool = 2/3 of the testbed):\n")
    add(table(rows, ["model", "testbed", "TFLOP / forward", "s / generation (T=20)", "s / trained cell",
                     "max cells / chunk", "TAG inference copy fits"]) + "\n")
    add("## Ablation: naive -> +GAP -> +TSP -> +TAG -> +TCSS\n")
    add("![ablation](figures/ablation.png)\n")
    rows = []
    for c in res["ablation"]:
        r = c["rows"]
        rows.append([MODELS[c["model"]].name, c["testbed"], c["T"], f"{speed(r, 'naive', 'step_time_s'):.0f}"]
                    + [fmt(speed(r, m)) for m in ("gap", "gap_tsp", "gap_tsp_tag", "full")]
                    + [fmt(speed(r, "colocated"))])
    pub = PUBLISHED_ABLATION
    rows.append(["published (HunyuanVideo)", "", "", ""] + [f"{pub[m][0]}-{pub[m][1]}x" for m in
                                                          ("gap", "gap_tsp", "gap_tsp_tag", "full")] + [""])
    add(table(rows, ["model", "testbed", "T", "naive step (s)", "+GAP", "+TSP", "+TAG", "+TCSS", "colocated"])
        + "\n")
    add("## Against colocation\n")
    add("![vs colocated](figures/vs_colocated.png)\n")
    rows = []
    for c in res["coloc"]:
        r, (on, tc) = c["rows"], PUBLISHED_COLOC[c["model"]]
        rows.append([MODELS[c["model"]].name, c["testbed"], f"{speed(r, 'colocated', 'step_time_s'):.0f}",
                     fmt(speed(r, "gap_tsp", "speedup_vs_colocated")), fmt(speed(r, "gap_tsp_tag", "speedup_vs_colocated")),
                     fmt(speed(r, "full", "speedup_vs_colocated")),
                     f"{on[0]}-{on[1]}x" + (f" ({tc[0]}-{tc[1]}x)" if tc else "")])
    add(table(rows, ["model", "testbed", "colocated step (s)", "gap_tsp", "gap_tsp_tag", "full",
                     "published (with TCSS)"]) + "\n")
    add("Sensitivity to per-operation time variance (log-normal jitter of every op, sigma; splits fixed to "
        "the exact-cost choice; 10 steps). Values are speedups over colocation under the same jitter:\n")
    rows = [[MODELS[j["model"]].name, j["testbed"], j["sigma"]] + [fmt(j["vs_colocated"][m]) for m in
            ("naive", "gap_tsp", "gap_tsp_tag", "full")] for j in res["jitter"]]
    add(table(rows, ["model", "testbed", "sigma", "naive", "gap_tsp", "gap_tsp_tag", "full"]) + "\n")
    add("## Heterogeneous cluster A+C\n")
    rows = []
    for c in res["hetero"]:
        r = c["rows"]
        full = next(x for x in r if x["mode"] == "full")
        coloc = next(x for x in r if x["mode"] == "colocated")
        rows.append([MODELS[c["model"]].name, f"{full['gen_gpus']}+{full['trainer_gpus']} ({full['note']})",
                     f"{full['step_time_s']:.0f}", fmt(speed(r, "gap_tsp_tag", "speedup_vs_colocated")),
                     fmt(full["speedup_vs_colocated"]), coloc["note"], fmt(full["speedup_vs_naive"])])
    add(table(rows, ["model", "DigenRL pools", "full step (s)", "gap_tsp_tag vs coloc", "full vs coloc",
                     "best colocated baseline", "full vs naive (A+C)"]) + "\n")
    add(f"Published: {PUBLISHED_HETERO[0]}-{PUBLISHED_HETERO[1]}x.\n")
    add("## Gantt charts (HunyuanVideo)\n")
    for name, title in figs:
        add(f"**{title}**\n\n![{name}](figures/{name})\n")
    add("## BTS\n")
    rows = [[b["mode"], b["jitter"], b["decisions"], b["inserted"], f"{b['memo_hit_rate']:.0%}",
             f"{b['search_median_s'] * 1e3:.1f}", f"{b['search_max_s'] * 1e3:.1f}", b["budget_hits"],
             f"{b['makespan_rel_error_mean']:.2%}"] for b in res["bts"]]
    add("HunyuanVideo on testbed A (predicted commit time at a step's first bubble vs realized):\n")
    add(table(rows, ["mode", "jitter", "decisions", "TAG fragments", "memo hits", "median ms", "max ms",
                     "budget hits", "mean makespan error"]) + "\n")
    add(DISCUSSION)
    out.write_text("\n".join(L) + "\n")


DISCUSSION = """## Where the model agrees with the published numbers, where it does not, and why

**Naive disaggregation is about 2x slower than colocation**, in the model (0.51x for the video models,
0.40-0.49x for FLUX) and implicitly in the published numbers (their TCSS gains over naive divided by their
gains over colocation give ~2.2x). This is arithmetic: with training/generation work ratio r (~2.4 here:
S = 0.6 T trained cells, each a forward + backward + recomputed forward, against T forwards per sample),
the best split still leaves one pool idle while the other works, step >= (1 + sqrt r)^2 / (1 + r) times
the colocated step = 1.9x for r = 2.4.

**GAP and TSP land at the low end of the published ranges** (GAP 1.40-1.59x vs 1.52-1.84x, +TSP
1.57-1.65x vs 1.62-2.14x). GAP overlaps rollout with training group by group; TSP lets every rank work on
every group (with 12 generations per group and 20+ trainer ranks, the classic per-group data-parallel shard
leaves ranks idle). For video one cell (~14k tokens) already saturates a GPU and memory allows only a few
cells per chunk, so TSP gains by spreading chunks over all ranks, not by packing. For FLUX on testbeds A
and B, GAP *without* TSP is slower than naive (0.81-0.88x): its per-group shards are 1-generation chunks
whose ZeRO-3 parameter gathers (2 x 24 GB at 25-50 GB/s) exceed their compute, while naive's contiguous
shards pack a rank's 8 local samples; TSP chunks fix this. On C the H20's low compute hides the gathers and
GAP alone gives 1.50x.

**TAG and TCSS help, but less than published** (+TAG 1.76-1.86x vs 2.28-3.05x; +TCSS 1.88-1.92x vs
2.49-3.34x), and **the model does not reproduce a gain over colocation with exact costs** (full reaches
0.96-0.97x of colocation for the video models, 0.88-0.94x for FLUX, against published 1.04-1.49x). The
reason is structural: when every operation runs at the same efficiency in both designs, colocation has no
idle time at all (every GPU generates its share, then trains its share), so a disaggregated schedule can at
best match it; TAG and TCSS recover most of the disaggregation loss (from 0.51x to 0.96x) but cannot exceed
the colocated ideal. Their published gains over colocation must come from effects this roofline leaves out
on purpose: (1) **variance**: with per-operation jitter the colocated barriers wait for stragglers while
the pipelined modes absorb them; the sensitivity table shows DigenRL overtaking colocation at sigma ~0.1 and
reaching 1.1-1.2x at sigma 0.3, i.e. the published range (variable reward-service latency, uneven
decoding, network contention); (2) **engine efficiency**: dedicated generators can run inference-optimized
kernels (fused attention, CUDA graphs, FP8, sequence parallelism) that the model prices exactly like the
training copy; (3) **colocation overheads** of real hybrid engines (offloading optimizer state and
re-sharding between training and inference layouts each step) that a pure FSDP colocation does not pay in
the model. The simulated generation/training switch is free or overlapped here because HunyuanVideo's
per-forward compute (>2 s) hides the ZeRO-3 gathers.

**The ranking across T = 20/30/40 is flat in the model** because every cost scales with T (S = 0.6 T) and
the fixed costs (commit ~1 s, publish ~1 s) are small against minutes-long steps; published ranges vary with
T through effects (e.g. per-step fixed overheads of real systems) the model does not have.

**Heterogeneous A+C is where the model comes closest to the published gain**: on the mixed cluster DigenRL
puts each pool on the GPU kind that can hold it and, through TAG, also uses the trainer pool for
generation, so all 48 GPUs work; colocation must either run on one homogeneous part or run lock-step at the
pace and memory of the weaker kind. Wan2.1 (14B with CFG) cannot train on 48 GB GPUs at all, so its best
colocated baseline is the 16 x H20 part and DigenRL (L40S generators, H20 trainers) gets 1.40x, close to
the published 1.46-1.85x; for HunyuanVideo and FLUX colocation on the 32 L40S is a strong baseline and the
gain is 1.07-1.14x.

**BTS** predicts the step's commit time within 0.1 % (exact costs: its no-TAG prediction is exact, and the
search's quantized model is close), decides in ~1-8 ms median, and with exact costs is never slower than
`gap_tsp` (property-tested).
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--reuse", action="store_true", help="re-render from the saved results")
    ap.add_argument("--out", default=str(ROOT / "docs" / "simulation.md"))
    args = ap.parse_args(argv)
    figdir = ROOT / "docs" / "figures"
    figdir.mkdir(parents=True, exist_ok=True)
    cache = figdir / "simulation_results.json"
    if args.reuse and cache.exists():
        res = json.loads(cache.read_text())
    else:
        res = run_all(args.steps)
        cache.write_text(json.dumps(res, indent=1))
    bar_figures(res, figdir)
    figs = gantts(figdir)
    sys.path.insert(0, str(Path(__file__).parent))
    render(res, figs, Path(args.out))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
