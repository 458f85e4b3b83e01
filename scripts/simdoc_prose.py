"""The comparison sections of docs/simulation.md (ablation, colocation, LoRA, heterogeneous) and the page
(the BTS section comes from ``simdoc_bts``).

Prose is assembled from the results: every number in a sentence is a value of the results dict.
"""

from __future__ import annotations

from simdoc_render import (NAMES, PUBLISHED_ABLATION, PUBLISHED_COLOC, PUBLISHED_HETERO, cost, costs_section,
                           efficiency_section, flops_section, pct, range_of, rng, row, run, table, x)

MECH = ("gap", "gap_tsp", "gap_tsp_tag", "full")


def _switch(c: dict) -> float:
    return c.get("coloc_gather_s", 0.0) + c.get("coloc_handoff_s", 0.0) + c.get("coloc_offload_s", 0.0)


def _publish_words(c: dict, step_s: float) -> str:
    """What the chosen publish path costs the trainers (and, streamed, the generators)."""
    path, mine = c.get("publish_path", "object_store"), c.get("publish_trainer_s", c["publish_s"])
    words = {"object_store": "an object-store publish", "broadcast": "a broadcast publish",
             "stream": "the sends of a streamed publish"}[path]
    out = f"{mine:.2f} s of {words} on its trainers ({mine / step_s:.1%} of its step)"
    if path == "stream":
        out += f"; the generators receive for {c['publish_s']:.1f} s while the trainers go on"
    return out


def reasons(res: dict, model: str, tb: str) -> tuple[str, str]:
    """Why full differs from the paper over naive and over colocation, from this configuration's numbers."""
    rows, c = run(res, model, tb)["rows"], cost(res, model, tb)
    naive, full, col = row(rows, "naive"), row(rows, "full"), row(rows, "colocated")
    ceiling = col["speedup_vs_naive"]
    vs_naive = (f"naive idles {pct(naive['gen_idle'])} of generator and {pct(naive['trainer_idle'])} of trainer "
                f"time; full leaves {pct(full['gen_idle'])} / {pct(full['trainer_idle'])}. Colocation (no idle pool, "
                f"gradients reduce-scattered once per commit) is {x(ceiling)} naive; full reaches "
                f"{full['speedup_vs_naive'] / ceiling:.0%} of it")
    sw = _switch(c)
    off = " incl. optimizer offload over PCIe" if c.get("coloc_offload") else ", no offload needed"
    vs_col = (f"colocation pays {sw:.2f} s of switching per {col['step_time_s']:.0f} s step "
              f"({sw / col['step_time_s']:.1%}: FSDP gather + bucketed hand-off{off}) and generates "
              f"{col['fragment_size']} at a time per GPU (memory allows {int(c.get('coloc_max_batch', 0))}); full "
              f"pays {_publish_words(c, full['step_time_s'])}, the idle time above and, on the shard group, a gradient reduce-scatter per chunk "
              f"({c.get('fsdp_scatter_s', 0.0):.2f} s each, overlapped with compute)")
    on, tc = PUBLISHED_COLOC[model]
    pub = tc or on
    if pub:
        ref = row(rows, "full" if tc else "gap_tsp_tag")["step_time_s"]
        lo, hi = (p * ref / col["step_time_s"] - 1 for p in pub)
        vs_col += (f". To reproduce the paper's {rng(pub)} with this disaggregated step, colocation would have to "
                   f"lose {lo:.0%}-{hi:.0%} of its step to overheads; the hardware facts above give "
                   f"{sw / col['step_time_s']:.1%}")
    return vs_naive, vs_col


def ablation_section(res: dict) -> list[str]:
    rows = []
    for c in res["runs"]:
        r = c["rows"]
        rows.append([NAMES[c["model"]], c["testbed"], c["T"], f"{row(r, 'naive')['step_time_s']:.0f}"]
                    + [x(row(r, m)["speedup_vs_naive"]) for m in MECH] + [x(row(r, "colocated")["speedup_vs_naive"])])
    rows.append(["published (HunyuanVideo)", "", "", ""] + [rng(PUBLISHED_ABLATION[m]) for m in MECH] + [""])
    video = [c for c in res["runs"] if c["model"] in ("hunyuan_video", "wan")]
    span = {m: range_of([row(c["rows"], m)["speedup_vs_naive"] for c in video]) for m in MECH + ("colocated",)}
    t_spread = max(abs(row(c["rows"], "full")["speedup_vs_naive"]
                       - row(run(res, c["model"], c["testbed"], 20)["rows"], "full")["speedup_vs_naive"])
                   for c in video)
    return ["## Ablation: naive -> +GAP -> +TSP -> +TAG -> +TCSS (speedup over naive)\n",
            "![ablation](figures/ablation.png)\n",
            table(rows, ["model", "testbed", "T", "naive step (s)", "+GAP", "+TSP", "+TAG", "+TCSS", "colocated"]) + "\n",
            f"Video models, all testbeds and T: +GAP {span['gap']} (paper {rng(PUBLISHED_ABLATION['gap'])}), +TSP "
            f"{span['gap_tsp']} ({rng(PUBLISHED_ABLATION['gap_tsp'])}), +TAG {span['gap_tsp_tag']} "
            f"({rng(PUBLISHED_ABLATION['gap_tsp_tag'])}), +TCSS {span['full']} ({rng(PUBLISHED_ABLATION['full'])}); "
            f"colocation itself is {span['colocated']} naive. T changes full's speedup by at most "
            f"{t_spread:.2f} because every cost scales with T (S = 0.6 T) and the fixed costs (commit, publish) "
            "are small against the step.\n"]


def coloc_section(res: dict) -> list[str]:
    rows, why = [], []
    for c in res["runs"]:
        if c["T"] != 20:
            continue
        m, tb, r = c["model"], c["testbed"], c["rows"]
        on, tc = PUBLISHED_COLOC[m]
        full = row(r, "full")
        rows.append([NAMES[m], tb, f"{row(r, 'colocated')['step_time_s']:.0f}", x(row(r, "naive")["speedup_vs_colocated"]),
                     x(row(r, "gap_tsp")["speedup_vs_colocated"]), x(row(r, "gap_tsp_tag")["speedup_vs_colocated"]),
                     x(full["speedup_vs_colocated"]), rng(on), rng(tc), x(full["speedup_vs_naive"]),
                     rng(PUBLISHED_ABLATION["full"]) if m == "hunyuan_video" else "-"])
        vn, vc = reasons(res, m, tb)
        pub = f"paper, full: {rng(tc)}" if tc else (f"paper, gap_tsp_tag: {rng(on)}" if on else "no paper number")
        why.append(f"* **{NAMES[m]} / {tb}**: over naive {x(full['speedup_vs_naive'])}"
                   + (f" (paper {rng(PUBLISHED_ABLATION['full'])})" if m == "hunyuan_video" else "")
                   + f" - {vn}. Over colocation {x(full['speedup_vs_colocated'])} ({pub}) - {vc}.")
    return ["## New ablation against naive and against colocation, per model and testbed (T = 20)\n",
            "![vs colocated](figures/vs_colocated.png)\n",
            table(rows, ["model", "testbed", "colocated step (s)", "naive", "gap_tsp", "gap_tsp_tag", "full",
                         "paper gap_tsp_tag", "paper full", "full vs naive", "paper full vs naive"]) + "\n",
            "Why each configuration lands where it does (numbers of that run):\n", "\n".join(why) + "\n"]


def summary_section(res: dict) -> list[str]:
    """Where disaggregation wins, where it does not, and why (from the runs)."""
    t20 = [c for c in res["runs"] if c["T"] == 20]
    vs_naive = [row(c["rows"], "full")["speedup_vs_naive"] for c in t20]
    vs_col = [row(c["rows"], "full")["speedup_vs_colocated"] for c in t20]
    ceil = [row(c["rows"], "colocated")["speedup_vs_naive"] for c in t20]
    sw = [_switch(cost(res, c["model"], c["testbed"])) / row(c["rows"], "colocated")["step_time_s"] for c in t20]
    pubs = [cost(res, c["model"], c["testbed"]).get("publish_trainer_s", cost(res, c["model"], c["testbed"])["publish_s"])
            / row(c["rows"], "full")["step_time_s"] for c in t20]
    offl = sum(1 for c in t20 if cost(res, c["model"], c["testbed"]).get("coloc_offload"))
    limited = sum(1 for c in t20 if row(c["rows"], "colocated")["fragment_size"]
                  >= cost(res, c["model"], c["testbed"]).get("coloc_max_batch", 0))
    hy = [row(c["rows"], "colocated")["speedup_vs_naive"] for c in t20 if c["model"] == "hunyuan_video"]
    lo_pub = PUBLISHED_ABLATION["full"][0]
    paper = (f" The paper's {rng(PUBLISHED_ABLATION['full'])} over naive for HunyuanVideo "
             + (f"exceeds colocation's ({range_of(hy)}), so its naive or its colocation must carry costs this model "
                "does not have." if hy and lo_pub > max(hy) else f"lies within colocation's ({range_of(hy)})."))
    het = [b["step_time_s"] / h["full"]["step_time_s"] for h in res["hetero"] for b in h["baselines"]
           if "error" not in b and b["where"].startswith("chosen")]
    het_pg = [b["step_time_s"] * b["gpus"] / (h["full"]["step_time_s"] * (h["full"]["gen_gpus"]
              + h["full"]["trainer_gpus"])) for h in res["hetero"] for b in h["baselines"]
              if "error" not in b and b["where"].startswith("chosen")]
    gap_slow = [f"{NAMES[c['model']]}/{c['testbed']}" for c in t20 if row(c["rows"], "gap")["speedup_vs_naive"] < 1]
    slow = ""
    if gap_slow:
        c0 = next(c for c in t20 if row(c["rows"], "gap")["speedup_vs_naive"] < 1)
        k = cost(res, c0["model"], c0["testbed"])
        slow = (f" GAP without TSP is slower than naive on {', '.join(gap_slow)}: its per-group data-parallel "
                f"shards are 1-generation chunks, {k['train_s_per_cell']:.2f} s per cell on "
                f"{NAMES[c0['model']]}/{c0['testbed']} against {k['train_s_per_cell_at_8']:.2f} s per cell in 8-cell "
                f"chunks like naive's (one forward of {int(k['seq_tokens'])} tokens reaches "
                f"{k['train_eff_1cell']:.0%} of the plateau efficiency, and every chunk waits for two FSDP parameter "
                f"gathers of {k['fsdp_gather_s']:.2f} s); TSP's packed chunks remove this.")
    worst = max(t20, key=lambda c: row(c["rows"], "full")["speedup_vs_naive"])
    kw, nr = cost(res, worst["model"], worst["testbed"]), row(worst["rows"], "naive")
    gens = res["static"]["workloads"][worst["model"]]["generations"]
    naive_why = (f" Naive is slow on the sharded trainer pool: it trains a group one timestep at a time (the G "
                 f"generations of one timestep per chunk), and each chunk is a collective of the whole shard group, so on "
                 f"{NAMES[worst['model']]}/{worst['testbed']} each of the {nr['trainer_gpus']} ranks gets at most "
                 f"{-(-gens // nr['trainer_gpus'])} of the {gens} cells and waits for two parameter gathers and a "
                 f"gradient reduce-scatter ({2 * kw['fsdp_gather_s'] + kw['fsdp_scatter_s']:.2f} s) against "
                 f"{kw['train_compute_s_per_cell']:.2f} s of compute per cell; TSP's chunks, sized for the whole group, "
                 f"amortise them." if kw.get("fsdp_scatter_s") else "")
    return ["## Where disaggregation wins, where it does not, and why\n",
            f"* **Against naive `full` wins in {sum(v > 1 for v in vs_naive)} of {len(vs_naive)} configurations** "
            f"({range_of(vs_naive)} at T = 20). Colocation (the idealised colocated FSDP bound: every rank trains its own "
            f"chunks and reduce-scatters the gradients once, at the commit) is {range_of(ceil)} naive; `full` reaches "
            f"{min(v / c for v, c in zip(vs_naive, ceil)):.0%}-{max(v / c for v, c in zip(vs_naive, ceil)):.0%} of "
            f"it.{paper}{naive_why}{slow}",
            f"* **Against colocation on one GPU kind `full` wins in {sum(v > 1 for v in vs_col)} of {len(vs_col)} "
            f"configurations** ({range_of(vs_col)}; paper 1.04-1.49x). Priced "
            f"from bytes and bandwidths, the colocated switch (FSDP all-gather into an inference copy at the bus bandwidth of the ranks' placement, "
            f"hand-off to the inference engine in VeRL-Omni's style of 2 GB bucketed CUDA-IPC copies, optimizer offload "
            f"over PCIe as UniRL does when memory requires it) costs {min(sw):.1%}-{max(sw):.1%} of a colocated step; "
            f"offload is needed in {offl} of {len(t20)} configurations because the gradient buffer is free while a "
            f"colocated rank generates, so the 2P-byte inference copy takes its place; memory caps the colocated "
            f"generation batch below the planner's choice in {limited} of {len(t20)}. Disaggregation pays its publish on the trainers "
            f"({min(pubs):.1%}-{max(pubs):.1%} of its step) and residual idle time. An idle-free colocated schedule "
            f"with these switch costs is a bound no pipelined split of the same GPUs can beat when both run every "
            f"operation at the same efficiency. (flow_grpo samples in-process with the training module: no switch "
            f"at all, the LoRA rows below.)",
            f"* **On the heterogeneous A+C cluster**: {range_of(het)} over the best colocated baseline the planner "
            f"finds, {range_of(het_pg)} per GPU (equal GPU count)"
            + (": the extra GPUs of the other kind, not the mechanisms, make the gain.\n" if het_pg and max(het_pg) < 1
               else ".\n")]


def lora_section(res: dict) -> list[str]:
    rows = []
    for L in res["lora"]:
        if "error" in L:
            rows.append([NAMES[L["model"]], L["testbed"], "does not fit: " + L["error"]] + [""] * 6)
            continue
        c, r = L["costs"], L["rows"]
        fr = run(res, L["model"], L["testbed"])
        full_ft = row(fr["rows"], "full")["step_time_s"] if fr else float("nan")
        rows.append([NAMES[L["model"]], L["testbed"],
                     f"{c['publish_gb']:.2f} GB / {c['publish_s']:.2f} s ({c.get('publish_path', 'object_store')})",
                     f"{c['commit_s']:.2f}", f"{c['train_s_per_cell']:.2f}", f"{row(r, 'full')['step_time_s']:.0f}",
                     f"{full_ft:.0f}", x(row(r, "full")["speedup_vs_naive"]), x(row(r, "full")["speedup_vs_colocated"])])
    return ["## LoRA on the runtime's replicated trainer (the shipped GPU presets' training) vs full fine-tuning\n",
            "LoRA r = 64 on every token-stream linear of the blocks, replicas (all-reduce at the commit), a publish of "
            "the adapters only (the path the planner picked for `full`), no TAG switch (the training copy generates), training without base "
            "weight gradients:\n",
            table(rows, ["model", "testbed", "publish", "commit (s)", "s / trained cell", "LoRA full-mode step (s)",
                         "full-FT full-mode step (s)", "LoRA full vs naive", "LoRA full vs colocated"]) + "\n"]


def _usd_per_hour(where: str, gpus: int, full_usd: float) -> float:
    """Dollars per hour of a colocated baseline: its GPUs at their kind's list price (``sim.balanced``); a
    lock-step colocation over both kinds rents the whole cluster."""
    from digenrl.sim.balanced import GPU_HOUR_USD

    kinds = [k for k in GPU_HOUR_USD if k in where]
    if "min(" in where or len(kinds) != 1:
        return full_usd
    return gpus * GPU_HOUR_USD[kinds[0]][0]


def hetero_section(res: dict) -> list[str]:
    from digenrl.sim.balanced import GPU_HOUR_USD
    from digenrl.sim.presets import TESTBEDS

    ac = TESTBEDS["A+C"]
    full_usd = ac.count * GPU_HOUR_USD[ac.gpu.name][0] + ac.count2 * GPU_HOUR_USD[ac.gpu2.name][0]
    rows, notes = [], []
    for h in res["hetero"]:
        full = h["full"]
        gpus = full["gen_gpus"] + full["trainer_gpus"]
        for b in h["baselines"]:
            if "error" in b:
                rows.append([NAMES[h["model"]], f"{full['step_time_s']:.0f} ({full['note']})", b["where"],
                             "does not fit", "", "", ""])
                continue
            usd = _usd_per_hour(b["where"], b["gpus"], full_usd)
            rows.append([NAMES[h["model"]], f"{full['step_time_s']:.0f} ({full['note']})", b["where"],
                         f"{b['step_time_s']:.0f}", x(b["step_time_s"] / full["step_time_s"]),
                         x(b["step_time_s"] * b["gpus"] / (full["step_time_s"] * gpus)),
                         x(b["step_time_s"] * usd / (full["step_time_s"] * full_usd))])
        for tb, d in h["full_homog"].items():
            if "error" not in d:
                notes.append(f"{NAMES[h['model']]}: DigenRL `full` on the {d['gpus']} GPUs of {tb} alone: "
                             f"{d['step_time_s']:.0f} s.")
    return ["## Heterogeneous cluster A+C (32 x L40S + 16 x H20)\n",
            "DigenRL (`full`) uses all 48 GPUs. Each colocated baseline is listed with its GPU count; the last "
            "columns compare at equal GPU count (GPU-seconds per step, assuming linear scaling) and at equal cost "
            "(dollars per step at the GPU-hour prices of `sim.balanced.GPU_HOUR_USD`: "
            + "; ".join(f"{k} ${v[0]:.2f}, {v[1]}" for k, v in GPU_HOUR_USD.items() if k in (ac.gpu.name, ac.gpu2.name))
            + "). docs/where_disaggregation_wins.md adds the colocation load-balanced over both kinds. "
            f"Paper: {rng(PUBLISHED_HETERO)} over colocation.\n",
            table(rows, ["model", "DigenRL full step (s), pools", "colocated baseline", "its step (s)",
                         "speedup", "per-GPU speedup (equal GPU count)", "per-dollar speedup (equal cost)"]) + "\n",
            " ".join(notes) + "\n"]


def setup_section(res: dict) -> list[str]:
    s = res["static"]
    wl = "; ".join(f"{NAMES[k]}: {w['prompts']} prompts x {w['generations']} generations of {w['width']}x{w['height']}"
                   + (f"x{w['frames']}" if w["frames"] > 1 else "") for k, w in s["workloads"].items())
    tbs = "; ".join(f"{k} = {v}" for k, v in s["testbeds"].items())
    return ["## Setup\n",
            f"* **Workloads**: {wl}. T = 20 sampling steps unless stated, S = int(0.6 T) trained timesteps, "
            f"{res['steps']} optimizer steps per run (step time = makespan / steps), TCSS cap 0.5.",
            f"* **Training** (default): {s['training']}. Publish: {s['publish']}",
            f"* **Testbeds**: {tbs}. Every disaggregated mode gets its own best split (searched).",
            "* **Cost model of these runs**: " + s.get("cost_model", "the one before issue 36: every collective at "
                                                    "the per-GPU NIC rate, communication fully overlapped "
                                                    "(max(compute, comm)), attention's backward at 1x its forward "
                                                    "(regenerate with `python scripts/make_simulation_doc.py`)") + ".\n"]


def render(res: dict, figs: list[tuple[str, str]], bts: list[str] | None = None, bias: list[str] | None = None,
           algorithms: list[str] | None = None) -> str:
    """The page; ``bts``: the BTS section's lines (``simdoc_bts.section``, from the BTS benchmark results);
    ``bias``: the simulator against measured CPU runs (``simdoc_bias.section``); ``algorithms``: the per-algorithm
    costs (``simdoc_algorithms.section``)."""
    L = ["# Simulated speedups of DigenRL's execution modes\n",
         "Generated by `scripts/make_simulation_doc.py` from its results file (do not edit by hand): the scheduler "
         "of `digenrl.schedule` executed in virtual time with the roofline cost model of `digenrl.sim.roofline`. "
         "Inputs are model configs, datasheets and cited public measurements (sources in `src/digenrl/sim/`); "
         "nothing is fitted to the published speedups, which are shown only for comparison.\n"]
    L += setup_section(res) + (bias or []) + flops_section(res) + efficiency_section(res) + costs_section(res)
    L += summary_section(res) + coloc_section(res) + ablation_section(res) + lora_section(res) + hetero_section(res)
    L += algorithms or []
    L.append("## Gantt charts (HunyuanVideo)\n")
    L += [f"**{title}**\n\n![{name}](figures/{name})\n" for name, title in figs]
    L += bts or []
    return "\n".join(L) + "\n"
