"""Markdown of docs/simulation.md from the results dict of ``simdoc_runs.run_all`` (tables and prose).

Every number on the page is read from the results; the published ranges are constants of this file (the
paper's numbers, shown for comparison only).
"""

from __future__ import annotations

# Published speedups (DistFlow/DigenRL-style paper): cumulative over naive for HunyuanVideo; over colocation
# for gap_tsp_tag (on-policy) and full (with TCSS) per model; heterogeneous cluster over colocation.
PUBLISHED_ABLATION = {"gap": (1.52, 1.84), "gap_tsp": (1.62, 2.14), "gap_tsp_tag": (2.28, 3.05),
                      "full": (2.49, 3.34)}
PUBLISHED_COLOC = {"hunyuan_video": ((1.04, 1.37), (1.13, 1.49)), "wan": ((1.13, 1.34), (1.21, 1.45)),
                   "flux": ((1.06, 1.21), None), "qwen_image": (None, None)}
PUBLISHED_HETERO = (1.46, 1.85)
NAMES = {"flux": "FLUX.1-dev", "wan": "Wan2.1-T2V-14B", "hunyuan_video": "HunyuanVideo-13B",
         "qwen_image": "Qwen-Image-20B", "sd3": "SD3.5-Medium"}


def canonical_models(obj):
    """``obj`` (a results file's JSON) with every ``"model"`` value in the registry's spelling
    (``models.specs.canonical``): runs name a model as the presets' CLI does (``hunyuan``, ``qwen-image``)."""
    from digenrl.models.specs import canonical

    if isinstance(obj, dict):
        return {k: canonical(v) if k == "model" and isinstance(v, str) else canonical_models(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [canonical_models(v) for v in obj]
    return obj


def table(rows: list[list], header: list[str]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return "\n".join(out)


def x(v: float) -> str:
    return f"{v:.2f}x"


def pct(v: float) -> str:
    return f"{v:.0%}"


def rng(r) -> str:
    return f"{r[0]:.2f}-{r[1]:.2f}x" if r else "-"


def row(rows: list[dict], mode: str) -> dict:
    return next(r for r in rows if r["mode"] == mode)


def run(res: dict, model: str, tb: str, T: int = 20) -> dict | None:
    return next((c for c in res["runs"] if (c["model"], c["testbed"], c["T"]) == (model, tb, T)), None)


def cost(res: dict, model: str, tb: str) -> dict:
    return next(c for c in res["costs"] if (c["model"], c["testbed"]) == (model, tb))


def range_of(vals: list[float]) -> str:
    return f"{min(vals):.2f}-{max(vals):.2f}x" if vals else "-"


# ---- sections ------------------------------------------------------------------------------------------------
def flops_section(res: dict) -> list[str]:
    rows = []
    for f in res["flops"]:
        rows.append([NAMES[f["model"]], f"{f['params'] / 1e9:.2f}", f"{f['img'] / 1e9:.2f} / {f['txt'] / 1e9:.2f} / "
                     f"{f['joint'] / 1e9:.2f} / {f['sample'] / 1e9:.2f}", f"{f['n_img']} + {f['n_txt']}",
                     f"{f['fwd_tflop']:.1f}", f"{f['naive_tflop']:.1f}", x(f["naive_tflop"] / f["fwd_tflop"]),
                     pct(f["attn_share"]), f"{f['lora64'] / 1e6:.0f}"])
    return ["## FLOPs: per-stream parameter counts\n",
            "A token passes only the weights of its stream; the AdaLN modulation and the timestep/guidance/pooled "
            "embedders act once per sample. Counts are the closed forms of `digenrl.models.flops` from the published "
            "diffusers configs; `tests/sim/test_sim_flops.py` checks every stream count, the LoRA target widths "
            "and the total forward FLOPs against the diffusers classes built on the meta device "
            "(`torch.utils.flop_counter`).\n",
            table(rows, ["model", "params (B)", "img / txt / joint / per-sample (B)", "tokens (latent + text)",
                         "TFLOP / forward", "2 P seq + attn", "overcount", "attention share",
                         "LoRA r=64 params (M)"]) + "\n"]


def efficiency_section(res: dict) -> list[str]:
    e = res["efficiency"]
    prow = [[p["gpu"], f"{p['flop_per_byte']:.0f}", f"{p['plateau']:.3f}", p["how"]] for p in e["plateaus"]]
    rrow = [[NAMES[r["model"]], r["gpu"], r["shape"], r["steps"], f"{r['measured_s']:.2f}", f"{r['mfu']:.1%}",
             f"{r['predicted_s']:.2f}", f"{r['residual']:+.1%}", f"{r['loo_predicted_s']:.2f}",
             f"{r['loo_residual']:+.1%}", r["source"]] for r in e["residuals"]]
    loo = [abs(r["loo_residual"]) for r in e["residuals"]]
    fit = [abs(r["residual"]) for r in e["residuals"]]
    return ["## Efficiency per GPU kind, fitted to public measurements\n",
            "Achievable share of dense BF16 peak per forward = plateau x tokens / (tokens + 512). The plateau of a "
            "GPU kind is the geometric mean of the model-FLOP utilisation of its public end-to-end measurements "
            "(FLOPs above, VAE decode subtracted); a kind without a measurement takes the log-log regression of "
            f"the plateaus on peak FLOP per HBM byte (log plateau = {e['regression']['a']:.2f} "
            f"{e['regression']['b']:+.2f} log ratio). Not measured and stated as assumptions: the 512-token "
            "half-saturation, VAE/reward at 0.35 of peak, 3 ms per forward, and training at the inference "
            "efficiency (no public training step time of these models was found).\n",
            table(prow, ["GPU", "peak FLOP / HBM byte", "plateau", "how"]) + "\n",
            "Per-operation residuals (model / measured - 1) of the denoising-loop measurements: with the kind's "
            f"own fit (|residual| <= {max(fit):.1%}) and with the regression alone, leaving the kind's own "
            f"measurements out (|residual| up to {max(loo):.0%}: the uncertainty of the extrapolated L40S "
            "plateau).\n",
            table(rrow, ["model", "GPU", "W x H x frames", "steps", "measured (s)", "MFU", "model (s)", "residual",
                         "leave-kind-out (s)", "residual", "source"]) + "\n"]


def costs_section(res: dict) -> list[str]:
    rows = []
    for c in res["costs"]:
        name = NAMES[c["model"]]
        if "infeasible" in c:
            rows.append([name, c["testbed"], "does not fit: " + c["infeasible"]] + [""] * 8)
            continue
        sw = (f"{c['coloc_gather_s'] + c['coloc_handoff_s'] + c['coloc_offload_s']:.2f}"
              + (" (offload)" if c.get("coloc_offload") else "") if "coloc_gather_s" in c else "does not fit")
        rows.append([name, c["testbed"], f"{c['gen_s_per_sample']:.1f}", f"{c['train_s_per_cell']:.2f}",
                     int(c["max_cells"]), f"{c['commit_s']:.2f}",
                     f"{c['publish_gb']:.1f} GB / {c['publish_s']:.1f} s ({c.get('publish_path', 'object_store')})",
                     f"{c['tag_switch_s']:.2f}", sw, int(c.get("coloc_max_batch", 0)),
                     f"{c['plateau_gen']:.2f} / {c['plateau_train']:.2f}"])
    return ["Derived costs at the split, publish path, shard groups and TAG copy the planner chose for `full` (full "
            "fine-tuning, FSDP; the publish: its seconds and path, a stream's being the generators' receive):\n",
            table(rows, ["model", "testbed", "s / generation", "s / trained cell", "max cells / chunk", "commit (s)",
                         "publish", "TAG switch (s)", "colocated switch / step (s)", "colocated batch / GPU",
                         "plateau gen / train"]) + "\n"]
