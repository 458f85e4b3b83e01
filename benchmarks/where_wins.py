"""Where disaggregation wins, with numbers: ``full`` against the colocated baselines as the peers run them, at
equal GPU count and at equal cost, on 8, 16 and 32 GPUs and on the heterogeneous A+C cluster.

    python benchmarks/where_wins.py            # simulate, write benchmarks/results/where_wins.json and the page
    python benchmarks/where_wins.py --reuse    # re-render docs/where_disaggregation_wins.md from the results

Baselines (``digenrl.sim.baselines``; each a colocated run on the same GPUs, labelled with the peer config it
models): the *idealised* colocated bound (no peer runs it), *DanceGRPO's* loop (full fine-tuning, FSDP with
fp32 parameters, batch 1) and *flow_grpo's* (LoRA under DDP at its config's batch; only where flow_grpo has a
config for the model). ``full`` is priced as the runtime runs it, every setting searched by the planner, with
the training of the baseline it is compared to (full fine-tuning against DanceGRPO and the idealised bound;
LoRA against flow_grpo, on 32 GPUs); *full, runtime defaults* is the same split with the runtime's defaults
(object-store publish, one shard group, no TAG copy, the cost-model fragment size); *full, generators x1.56*
assumes the dedicated pool samples as much faster as torch.compile made FLUX in xDiT's figure
(``sim.variants.COMPILED_SPEEDUP``; the split held at ``full``'s). The sensitivity table re-prices the 32-GPU
rows with 0, 0.25 and 0.5 of the overlapped communication exposed (``sim.assumptions``; ``full``'s split held
at the default share's, everything else searched again). On A+C: the best single-kind colocation the planner
finds, the load-balanced colocation over both kinds (``sim.balanced``, analytic bound), per GPU and per dollar
(``sim.balanced.GPU_HOUR_USD``). Everything is virtual time (exact roofline costs, 20 steps): the numbers do
not depend on the machine's load.
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

from digenrl.sim.assumptions import Assumptions  # noqa: E402
from digenrl.sim.balanced import GPU_HOUR_USD, break_even_price, load_balanced_colocated  # noqa: E402
from digenrl.sim.baselines import dancegrpo, flow_grpo, idealised  # noqa: E402
from digenrl.sim.comm import EXPOSED_COMM_SHARE  # noqa: E402
from digenrl.schedule import Mode  # noqa: E402
from digenrl.sim.scenario import PresetSource, Scenario, ScenarioError, run_candidate, run_mode  # noqa: E402
from digenrl.sim.presets import model_preset, testbed_preset, workload_preset  # noqa: E402
from digenrl.sim.variants import COMPILED_SPEEDUP, UNMERGED_LORA_SLOWDOWN, FastGenerators, GeneratorPath  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "where_wins.json"
PAGE = ROOT / "docs" / "where_disaggregation_wins.md"
HOMOGENEOUS = [("hunyuan", "A"), ("wan", "B"), ("flux", "B"), ("qwen-image", "B")]
GPUS = (8, 16, 32)
HETERO = [("hunyuan", "A+C"), ("flux", "A+C")]
SHARES = (0.0, 0.25, 0.5)
STEPS = 20
NAMES = {"hunyuan": "HunyuanVideo-13B", "wan": "Wan2.1-T2V-14B", "flux": "FLUX.1-dev", "qwen-image": "Qwen-Image-20B"}


def _rec(r) -> dict:
    return {"step_s": r.result.step_time, "split": [r.n_gen, r.n_train], "note": r.note,
            "gen_idle": r.result.gen_idle, "trainer_idle": r.result.trainer_idle, "publish": r.publish,
            "shard_groups": r.shard_groups, "fragment": r.plan.fragment_size, "train_gpu": r.split.train_gpu.name}


def _step(setup: Scenario, mode: str, **kw) -> dict:
    try:
        return _rec(run_mode(setup, mode, **kw))
    except ScenarioError as e:
        return {"error": str(e)}


def _baseline(setup: Scenario, b) -> dict:
    s = replace(setup, workload=replace(setup.workload, training=b.training), variant=b.variant)
    return {**_step(s, "colocated"), "label": b.label, "source": b.source}


def _full_and_variants(setup: Scenario) -> dict:
    """``full`` searched, then at its split: the runtime's defaults, and generators x COMPILED_SPEEDUP."""
    try:
        r = run_mode(setup, "full")
    except ScenarioError as e:
        return {"full": {"error": str(e)}}
    out = {"full": _rec(r)}
    # the same split, every other setting the runtime's default (the scenario's training: object store, k = 1)
    out["full_defaults"] = _rec(run_candidate(setup, Mode.FULL, PresetSource(setup, Mode.FULL, split=r.split).start(r.split)))
    out["full_fast_gen"] = _step(replace(setup, variant=lambda c: FastGenerators(c, COMPILED_SPEEDUP)), "full",
                                 split=r.split)
    out["_split"] = r.split
    return out


def measure(model: str, tb: str, gpus: int) -> dict:
    testbed = testbed_preset(tb)
    w = workload_preset(model)
    base = Scenario(model_preset(model), testbed, w, gpus, STEPS, 0.5)
    out = {"model": model, "testbed": tb, "gpus": gpus,
           "idealised": _baseline(base, idealised(w.training)), "dancegrpo": _baseline(base, dancegrpo(model))}
    fv = _full_and_variants(base)
    split = fv.pop("_split", None)
    out.update(fv)
    if gpus == max(GPUS) and not testbed.heterogeneous:
        out["lora"] = lora(base, model)
        out["sensitivity"] = sensitivity(base, model, split)
    return out


def lora(base: Scenario, model: str) -> dict | None:
    """flow_grpo's LoRA loop against ``full`` with the same LoRA training and the idealised LoRA bound."""
    fg = flow_grpo(model)
    if fg is None:
        return None
    s = replace(base, workload=replace(base.workload, training=fg.training))
    out = {"flow_grpo": _baseline(base, fg), "idealised": _baseline(base, idealised(fg.training)),
           "training": f"LoRA r{fg.training.lora_rank}, replicated (DDP)"}
    for key, path in LORA_PATHS.items():  # each generator path planned on its own (split searched)
        out[key] = _step(replace(s, variant=path), "full")
    return out


# full with LoRA, per generator path (sim.variants.GeneratorPath): the trainers (TAG) always sample unmerged
LORA_PATHS = {
    "full": GeneratorPath,                                                           # generator.merge_lora=false
    "full_merged": lambda c: GeneratorPath(c, merged=True),                          # generator.merge_lora=true
    "full_fast": lambda c: GeneratorPath(c, speedup=COMPILED_SPEEDUP, merged=True),  # + generator.compile
}


def sensitivity(base: Scenario, model: str, split) -> dict:
    """The 32-GPU row with each exposed share: baselines re-run, ``full`` searched at the default's split."""
    out = {}
    for x in SHARES:
        s = replace(base, assume=Assumptions(exposed_comm=x))
        out[f"{x:g}"] = {"idealised": _baseline(s, idealised(s.workload.training)),
                         "dancegrpo": _baseline(s, dancegrpo(model)),
                         "full": _step(s, "full", split=split) if split is not None else {"error": "no split"}}
    return out


def hetero(model: str, tb: str) -> dict:
    testbed = testbed_preset(tb)
    w = workload_preset(model)
    base = Scenario(model_preset(model), testbed, w, testbed.total, STEPS, 0.5)
    out = {"model": model, "testbed": tb, "gpus": testbed.total,
           "idealised": _baseline(base, idealised(w.training)), "dancegrpo": _baseline(base, dancegrpo(model)),
           "balanced": load_balanced_colocated(base.model, w, testbed)}
    fv = _full_and_variants(base)
    fv.pop("_split", None)
    out.update(fv)
    out["single_kind"] = {}
    for kind, n in ((testbed.gpu, testbed.count), (testbed.gpu2, testbed.count2)):
        sub = replace(testbed, name=f"{tb}:{kind.name}", gpu=kind, count=n, gpu2=None, count2=0)
        out["single_kind"][kind.name] = {"gpus": n, **_step(replace(base, testbed=sub, gpus=n), "colocated")}
    return out


def costs_of(testbed) -> list:
    return [(testbed.gpu, testbed.count)] + ([(testbed.gpu2, testbed.count2)] if testbed.gpu2 else [])


def run_all(log=print) -> dict:
    t0 = time.perf_counter()
    rows = []
    for model, tb in HOMOGENEOUS:
        for g in GPUS:
            rows.append(measure(model, tb, g))
            log(f"{model} {tb} {g} GPUs [{time.perf_counter() - t0:.0f}s]")
    for model, tb in HETERO:
        rows.append(hetero(model, tb))
        log(f"{model} {tb} [{time.perf_counter() - t0:.0f}s]")
    return {"gen_factor": COMPILED_SPEEDUP, "exposed_comm": EXPOSED_COMM_SHARE, "shares": list(SHARES), "steps": STEPS,
            "prices": {k: {"usd_per_gpu_hour": v[0], "source": v[1]} for k, v in GPU_HOUR_USD.items()},
            "rows": rows, "seconds": round(time.perf_counter() - t0, 1)}


# ---- rendering -----------------------------------------------------------------------------------------------
def _ok(*rs) -> bool:
    return all(r is not None and "error" not in r for r in rs)


def _ratio(b: dict, f: dict) -> str:
    return f"{b['step_s'] / f['step_s']:.2f}x" if _ok(b, f) else "n/a"


def _cell(r: dict | None) -> str:
    if r is None:
        return "-"
    return "does not fit" if "error" in r else f"{r['step_s']:.1f}"


def _full_cell(r: dict) -> str:
    if "error" in r:
        return "does not fit"
    return f"{r['step_s']:.1f} ({r['split'][0]}+{r['split'][1]})"


def homogeneous_table(rows: list[dict], f: float) -> list[str]:
    lines = ["| model | testbed | GPUs | idealised colocated (s) | DanceGRPO loop (s) | full (s), split | "
             "full, runtime defaults (s) | full vs idealised | full vs DanceGRPO | defaults vs idealised | "
             f"full, generators x{f:.2f}, vs idealised |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["testbed"] == "A+C":
            continue
        full, co, dg, de = r["full"], r["idealised"], r["dancegrpo"], r.get("full_defaults", {"error": ""})
        lines.append(f"| {NAMES[r['model']]} | {r['testbed']} | {r['gpus']} | {_cell(co)} | {_cell(dg)} | "
                     f"{_full_cell(full)} | {_cell(de)} | {_ratio(co, full)} | {_ratio(dg, full)} | "
                     f"{_ratio(co, de)} | {_ratio(co, r.get('full_fast_gen', {'error': ''}))} |")
    return lines


def lora_table(rows: list[dict]) -> list[str]:
    lines = ["| model | testbed | GPUs | training | flow_grpo loop (s) | idealised colocated, LoRA (s) | "
             "full, generators unmerged (s), split | full, generators merged (s), split | full, merged + compiled "
             "(s), split | full vs flow_grpo: unmerged / merged / merged + compiled | full vs idealised: unmerged / "
             "merged / merged + compiled |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        L = r.get("lora")
        if not L:
            continue
        paths = [L.get(k, {"error": "not run"}) for k in LORA_PATHS]
        lines.append(f"| {NAMES[r['model']]} | {r['testbed']} | {r['gpus']} | {L['training']} | "
                     f"{_cell(L['flow_grpo'])} | {_cell(L['idealised'])} | "
                     + " | ".join(_full_cell(p) for p in paths) + " | "
                     + " / ".join(_ratio(L["flow_grpo"], p) for p in paths) + " | "
                     + " / ".join(_ratio(L["idealised"], p) for p in paths) + " |")
    return lines


def sensitivity_table(rows: list[dict], shares: list[float]) -> list[str]:
    head = "| model | testbed | GPUs | " + " | ".join(
        f"x = {x:g}: full vs idealised / vs DanceGRPO" for x in shares) + " |"
    lines = [head, "|" + "---|" * (3 + len(shares))]
    for r in rows:
        sen = r.get("sensitivity")
        if not sen:
            continue
        cells = [f"{_ratio(sen[f'{x:g}']['idealised'], sen[f'{x:g}']['full'])} / "
                 f"{_ratio(sen[f'{x:g}']['dancegrpo'], sen[f'{x:g}']['full'])}" for x in shares]
        lines.append(f"| {NAMES[r['model']]} | {r['testbed']} | {r['gpus']} | " + " | ".join(cells) + " |")
    return lines


def hetero_table(r: dict, prices: dict) -> tuple[list[str], str]:
    tb = testbed_preset(r["testbed"])
    full = r["full"]
    if "error" in full:
        return [f"{NAMES[r['model']]}: full does not fit on {r['testbed']}"], ""
    usd = {k: v["usd_per_gpu_hour"] for k, v in prices.items()}
    full_cost = sum(n * usd[g.name] for g, n in costs_of(tb))
    lines = [f"**{NAMES[r['model']]} on {r['testbed']}**: `full` {full['step_s']:.1f} s on all {r['gpus']} GPUs "
             f"({full['note']}, split {full['split'][0]}+{full['split'][1]}; runtime defaults at that split: "
             f"{_cell(r['full_defaults'])} s), ${full_cost:.0f} per hour.\n",
             "| baseline | GPUs | step (s) | $ per hour | full speedup, same GPUs | per GPU (equal GPU count) | "
             "per dollar (equal cost) | H20 break-even $/GPU-h |", "|---|---|---|---|---|---|---|---|"]
    bases = []
    for kind, rec in r["single_kind"].items():
        bases.append((f"colocated on {rec['gpus']} x {kind} alone (idealised)", rec, [(kind, rec["gpus"])]))
    bases.append((f"idealised colocated the planner picks ({r['idealised'].get('note', '')})", r["idealised"], None))
    bases.append(("DanceGRPO loop, colocated the planner picks", r["dancegrpo"], None))
    b = r["balanced"]
    bases.append(("colocation load-balanced over both kinds (analytic bound; shares of generation "
                  + ", ".join(f"{k} {v:.0%}" for k, v in b.get("gen_share", {}).items()) + ")",
                  {"step_s": b["step_s"], "split": [0, b["gpus"]]} if "step_s" in b else b, "all"))
    for name, rec, kinds in bases:
        if not _ok(rec):
            lines.append(f"| {name} | | does not fit | | | | | |")
            continue
        if kinds == "all":
            counts = costs_of(tb)
        elif kinds is None:  # the planner's colocation: on one kind, or lock-step over both (a "min(...)" GPU)
            n, g = rec["split"][1], rec.get("train_gpu", "")
            kind = {tb.gpu.name: tb.gpu, tb.gpu2.name: tb.gpu2}.get(g)
            counts = [(kind, n)] if kind is not None else costs_of(tb)
        else:
            kind = tb.gpu if kinds[0][0] == tb.gpu.name else tb.gpu2
            counts = [(kind, kinds[0][1])]
        gpus = sum(n for _, n in counts)
        cost = sum(n * usd[g.name] for g, n in counts)
        same = rec["step_s"] / full["step_s"]
        per_gpu = rec["step_s"] * gpus / (full["step_s"] * r["gpus"])
        per_usd = rec["step_s"] * cost / (full["step_s"] * full_cost)
        # the break-even H20 price: only where the baseline rents other GPUs than full does
        be = (break_even_price(rec["step_s"], counts, full["step_s"], costs_of(tb), tb.gpu2)
              if sorted((g.name, n) for g, n in counts) != sorted((g.name, n) for g, n in costs_of(tb)) else None)
        be_cell = f"{be:.2f}" if be is not None and 0 < be < 1e6 else ("-" if be is None else "never")
        lines.append(f"| {name} | {gpus} | {rec['step_s']:.1f} | {cost:.0f} | {same:.2f}x | {per_gpu:.2f}x | "
                     f"{per_usd:.2f}x | {be_cell} |")
    return lines, ""


def summary(res: dict) -> str:
    """The README's paragraph (``scripts/benchmarks_doc.py`` block ``where_wins``): ``full`` against each
    baseline, equal GPU count, one GPU kind, from the same results file as the page."""
    homog = [r for r in res["rows"] if r["testbed"] != "A+C"]
    ideal = [r["idealised"]["step_s"] / r["full"]["step_s"] for r in homog if _ok(r["idealised"], r["full"])]
    dg = [r["dancegrpo"]["step_s"] / r["full"]["step_s"] for r in homog if _ok(r["dancegrpo"], r["full"])]
    lo = {k: [r["lora"]["flow_grpo"]["step_s"] / r["lora"][k]["step_s"] for r in homog
              if r.get("lora") and _ok(r["lora"]["flow_grpo"], r["lora"].get(k))] for k in LORA_PATHS}
    span = lambda v: f"{min(v):.2f}-{max(v):.2f}x" if v else "-"  # noqa: E731
    n, gpus = len(homog), sorted({r["gpus"] for r in homog})
    return (f"Simulated, {n} rows ({len({r['model'] for r in homog})} models on {'/'.join(map(str, gpus))} GPUs of one kind) at equal GPU count (`digenrl.sim` roofline "
            f"costs, {res['exposed_comm']:g} of communication exposed; not GPU measurements), the step time of "
            f"the baseline over DigenRL's `full`: **idealised colocation** (no peer runs it; the bound) "
            f"{span(ideal)}, so on one GPU kind colocation is as fast or faster and `digenrl plan` picks it "
            f"where it is predicted faster; **DanceGRPO's loop** (FSDP full fine-tuning, one sample per "
            f"forward/backward) {span(dg)}; **flow_grpo's loop** (LoRA under DDP, its batches, sampling with the "
            f"adapters unmerged) {span(lo['full'])} with unmerged generators, {span(lo['full_merged'])} with "
            f"`generator.merge_lora`, {span(lo['full_fast'])} merged and compiled (public factors x1.28 and "
            f"x{res['gen_factor']:.2f}). From `benchmarks/results/where_wins.json` (`python "
            "benchmarks/where_wins.py`); the tables, the sensitivity to exposed communication and the "
            "heterogeneous case are in [docs/where_disaggregation_wins.md](docs/where_disaggregation_wins.md).")


def render(res: dict) -> str:
    rows, f, x0 = res["rows"], res["gen_factor"], res["exposed_comm"]
    prices = res["prices"]
    lines = [
        "# Where disaggregation wins\n",
        "Generated by `python benchmarks/where_wins.py` from `benchmarks/results/where_wins.json` (do not edit by "
        "hand). Virtual time, exact roofline costs of `digenrl.sim`, 20 steps, every split searched. A speedup is "
        "the baseline's step / `full`'s step: above 1.00x DigenRL's `full` mode is faster, below it the baseline "
        "is.\n",
        "The cost model (issue 36): collectives priced by where their ranks sit (NVLink inside an HGX node, one "
        "NIC per GPU across nodes, `sim.comm`), "
        f"{x0:g} of the overlapped communication exposed (`sim.assumptions`; the sensitivity table shows 0, 0.25 "
        "and 0.5), attention's backward at 2.5x its forward (FlashAttention-2).\n",
        "Baselines (`sim.baselines`), each a colocated run on the same GPUs and labelled with the config it models:\n",
        "* **idealised colocated**: every rank generates then trains its local batch per timestep, no idle time, "
        "the switch priced from bytes and bandwidths. No peer runs this loop: it is the bound;",
        "* **DanceGRPO loop**: full fine-tuning under FSDP with fp32 parameters, one sample per sampling forward "
        "and one sample x one timestep per forward/backward, each forward gathering the parameters and each "
        "backward reduce-scattering fp32 gradients (DanceGRPO's `train_grpo_flux.py` / `train_grpo_hunyuan.py`; "
        "for Wan and Qwen-Image DanceGRPO has no config: the same loop, labelled as its loop);",
        "* **flow_grpo loop**: LoRA under DDP (the fp32 LoRA gradients all-reduced at the sync step), sampling in "
        "batches of its `sample.train_batch_size` and training `train.batch_size` samples of one timestep per "
        "forward/backward (FLUX 3, Qwen-Image 4, Wan 8; `config/grpo.py`), sampling on the peft module with the "
        f"adapters unmerged (every denoising forward x{UNMERGED_LORA_SLOWDOWN:.2f}: a LoRA rollout 28% slower "
        "than without LoRA, verl-omni issue 248; `sim.variants`), against `full` with the same LoRA training, "
        "planned per generator path: generators sampling unmerged (the runtime's default), with "
        "`generator.merge_lora` (the adapters merged once per version), and merged + `generator.compile` "
        f"(x{f:.2f}); TAG-ing trainer ranks always sample unmerged; the idealised LoRA bound may merge;",
        "* **full, runtime defaults**: `full` at the planned split with the runtime's defaults (object-store "
        "publish, one shard group, no TAG inference copy, the cost-model fragment size);",
        f"* **full, generators x{f:.2f}**: the dedicated generator pool samples {f:.2f}x faster than a training "
        "rank, the ratio torch.compile gave FLUX.1-dev on one H100 in xDiT's figure (6.71 s / 4.30 s; "
        "`sim.variants.COMPILED_SPEEDUP`, `benchmarks/anchors.py`); split held at `full`'s.\n",
        "## Full fine-tuning: equal GPU count (= equal cost on one GPU kind)\n",
    ] + homogeneous_table(rows, f)
    homog = [r for r in rows if r["testbed"] != "A+C"]
    ideal = [r["idealised"]["step_s"] / r["full"]["step_s"] for r in homog if _ok(r["idealised"], r["full"])]
    dg = [(r, r["dancegrpo"]["step_s"] / r["full"]["step_s"]) for r in homog if _ok(r["dancegrpo"], r["full"])]
    de = [r["idealised"]["step_s"] / r["full_defaults"]["step_s"] for r in homog
          if _ok(r["idealised"], r.get("full_defaults"))]
    fast = [r["idealised"]["step_s"] / r["full_fast_gen"]["step_s"] for r in homog
            if _ok(r["idealised"], r.get("full_fast_gen"))]
    nofit = [r for r in homog if "error" in r["idealised"] and _ok(r["full"])]
    coloc_wins = [r for r in homog if _ok(r["idealised"], r["full"]) and r["idealised"]["step_s"] < r["full"]["step_s"]]
    lines += ["", "## LoRA: flow_grpo's loop on 32 GPUs\n"] + lora_table(rows)
    lo = {k: [(r, r["lora"]["flow_grpo"]["step_s"] / r["lora"][k]["step_s"]) for r in homog
              if r.get("lora") and _ok(r["lora"]["flow_grpo"], r["lora"].get(k))] for k in LORA_PATHS}
    lines += ["", f"## Sensitivity to the exposed share of communication (32 GPUs; default {x0:g})\n",
              "`full`'s split held at the default's plan, every other setting searched again; both baselines "
              "re-priced.\n"] + sensitivity_table(rows, res["shares"])
    lines += ["", "## Heterogeneous A+C (32 x L40S + 16 x H20): equal GPU count and equal cost\n",
              "Prices per GPU-hour (`sim.balanced.GPU_HOUR_USD`): "
              + "; ".join(f"{k} ${v['usd_per_gpu_hour']:.2f} ({v['source']})" for k, v in prices.items())
              + ". *Per GPU* divides each step by the GPUs it uses (linear scaling assumed), *per dollar* by "
              "its dollars per hour; the last column is the H20 price per GPU-hour at which the two cost the same "
              "per step (the L40S at its list price).\n"]
    for r in rows:
        if r["testbed"] == "A+C":
            t, _ = hetero_table(r, prices)
            lines += t + [""]
    lines += ["## What the tables say\n",
              f"* **Colocation wins on one GPU kind at equal per-operation efficiency**: against the idealised "
              f"bound `full` is {min(ideal):.2f}-{max(ideal):.2f}x"
              + (f"; the bound is faster in {len(coloc_wins)} of {len(ideal)} rows" if coloc_wins else "")
              + ". An idle-free colocated schedule does the same work on the same GPUs with no publish and no "
              "pool boundary. The planner can pick it: `digenrl plan` plans the colocated run on the same workers "
              "beside the disaggregated one, reports which is faster (`colocated.faster` in its JSON) and warns "
              "when colocation wins; the shipped presets default to `runtime.mode: colocated` where it is "
              "predicted faster (`scripts/plan_presets.py`).",
              "* **Against DanceGRPO's loop** `full` is "
              + ", ".join(f"{NAMES[m]} {min(v for r, v in dg if r['model'] == m):.2f}-"
                          f"{max(v for r, v in dg if r['model'] == m):.2f}x"
                          for m in dict.fromkeys(r["model"] for r, _ in dg))
              + ": per-cell forward/backward passes pay a parameter gather and an fp32 reduce-scatter per "
              "sample and timestep, and batch-1 sampling gathers per forward; with NVLink credited inside a node "
              "these costs are small on video's long sequences and large on images'.",
              ("* **Against flow_grpo's loop** (LoRA, same training): with its generators sampling unmerged as "
               "flow_grpo does, `full` is " + ", ".join(f"{NAMES[r['model']]} {v:.2f}x" for r, v in lo["full"])
               + ": flow_grpo's replicated LoRA has no switch and a small all-reduce, so the pipeline alone saves "
               "little there" + (" and is slower where it is below 1.00x" if any(v < 1 for _, v in lo["full"])
                                 else "") + ". With `generator.merge_lora` it is "
               + ", ".join(f"{NAMES[r['model']]} {v:.2f}x" for r, v in lo["full_merged"])
               + ", and merged + compiled " + ", ".join(f"{NAMES[r['model']]} {v:.2f}x" for r, v in lo["full_fast"])
               + ": the generator pool runs the inference-optimised model a colocated trainer samples without. "
               "These two rest on the public factors above (1.28 unmerged, 1.56 compiled, measured on other "
               "setups), not on a GPU measurement of this project (`benchmarks/fast_generator.py` measures them on "
               "CPU: docs/fast_generator.md).") if lo["full"] else "* No flow_grpo row.",
              f"* **The runtime's defaults** reach {min(de):.2f}-{max(de):.2f}x of the idealised bound against "
              f"the planned {min(ideal):.2f}-{max(ideal):.2f}x: the planner's search of publish path, shard groups, "
              "TAG copy and fragment size is what closes most of the gap; run `digenrl plan` before a run." if de
              else "* No runtime-defaults row.",
              f"* **With generators {f:.2f}x faster** (an inference-optimised generator pool) `full` is "
              f"{min(fast):.2f}-{max(fast):.2f}x the idealised bound: disaggregation wins when the generator pool "
              "runs faster than a colocated rank can." if fast else "",
              "* **Where colocation does not fit, disaggregation still runs**: "
              + ("; ".join(f"{NAMES[r['model']]} on {r['gpus']} GPUs of {r['testbed']} ({r['full']['step_s']:.0f} s "
                           f"per step, {r['full']['split'][0]}+{r['full']['split'][1]})" for r in nofit)
                 if nofit else "no such case in this table") + ".",
              "* **On A+C** compare per GPU and per dollar, not per step: `full` uses all 48 GPUs, the single-kind "
              "colocations 32 or 16; the load-balanced colocation over both kinds is the same-GPU, same-cost "
              "baseline.\n"]
    ceiling = ROOT / "benchmarks" / "results" / "preset_ceiling.json"
    if ceiling.exists():
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from preset_ceiling import table

        entries = json.loads(ceiling.read_text())
        lines += ["## What moved the 10 presets\n",
                  "`full` vs idealised colocation on the whole testbed, measured at successive commits by "
                  "`python benchmarks/preset_ceiling.py --label ... --src <worktree>/src` "
                  "(`benchmarks/results/preset_ceiling.json`); the last columns are of the last entry. Entries: "
                  + "; ".join(f"*{e['label']}* = commit {e['commit']}" for e in entries) + ". (The trainer idle "
                  "share counts ranks waiting inside a collective chunk from the second entry on"
                  + _cost_model_note(entries) + ".)\n",
                  table(entries), ""]
    return "\n".join(lines)


def _cost_model_note(entries: list[dict]) -> str:
    """Which entries price the cost model of issue 36 (the tables above use it): from the first entry whose label
    names it on."""
    first = next((e for e in entries if "issue 36" in e["label"]), None)
    if first is None:
        return "; every entry predates the cost model of issue 36, which the tables above use"
    return (f"; the entries from *{first['label']}* on price the cost model of issue 36 (NVLink, exposed "
            "communication, attention backward), the one of the tables above, so their ratios are not comparable "
            "with the earlier entries'")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reuse", action="store_true", help="render the page from the saved results")
    ap.add_argument("--only-lora", action="store_true",
                    help="re-simulate only the LoRA section (flow_grpo's loop, the generator paths) of the saved "
                         "results, keep the rest, and render the page")
    args = ap.parse_args()
    if args.only_lora:
        res = json.loads(RESULTS.read_text())
        t0 = time.perf_counter()
        for r in res["rows"]:
            if "lora" in r:
                w = workload_preset(r["model"])
                base = Scenario(model_preset(r["model"]), testbed_preset(r["testbed"]), w, r["gpus"], STEPS, 0.5)
                r["lora"] = lora(base, r["model"])
                print(f"{r['model']} {r['testbed']} {r['gpus']} LoRA [{time.perf_counter() - t0:.0f}s]", flush=True)
        tmp = RESULTS.with_suffix(".tmp")
        tmp.write_text(json.dumps(res, indent=1, default=str))
        tmp.replace(RESULTS)
        PAGE.write_text(render(res))
        print(f"wrote {RESULTS} and {PAGE}")
        return 0
    if args.reuse:
        res = json.loads(RESULTS.read_text())
    else:
        res = run_all()
        tmp = RESULTS.with_suffix(".tmp")
        tmp.write_text(json.dumps(res, indent=1, default=str))
        tmp.replace(RESULTS)
    PAGE.write_text(render(res))
    print(render(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
