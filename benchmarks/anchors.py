"""Anchors: the simulator predicts three public GPU figures; the error of each, and what was assumed.

    python benchmarks/anchors.py            # writes benchmarks/results/anchors.json (a few seconds, virtual time)

(a) FLUX.1-dev, 1024 x 1024, 28 steps, batch 1, one H100: 6.71 s eager, 4.30 s with torch.compile (xDiT
    docs/performance/flux.md; 6.27 / 3.88 s reproduced in xDiT issue 378). Priced as 28 denoising forwards +
    the VAE decode on one H100 (``RooflineCost`` generator ops); compiled = eager / ``COMPILED_SPEEDUP``.
(b) VeRL-Omni's FlowGRPO on Qwen-Image (OCR task), full fine-tuning without CFG: 0.510 images per GPU per second
    on 4 x H200 at 512 images per step (verl-omni docs/algo/performance.md). Priced as the idealised colocated
    step (``colocated`` mode: VeRL-Omni is a hybrid engine) on 4 of testbed D's H200s, with 2 and with 9
    trained timesteps (the source does not say; two flow_grpo configs give the two readings).
(c) The MixGRPO paper's DanceGRPO FLUX step: 291.3 s per iteration on 32 GPUs (arXiv 2507.21802, training
    overhead comparison). Priced as DanceGRPO's loop (``sim.baselines.DanceGRPOLoop``: batch 1, FSDP with fp32
    parameters, per-cell gathers) with MixGRPO's DanceGRPO settings (720 x 720, 25 sampling steps, 14 trained,
    32 prompts x 12 generations). The paper does not name the GPU: priced on 32 H20 (4 HGX nodes, 200 Gb/s) and
    on 32 H100 (testbed B); both rows are written, neither is chosen after the fact.

The error is predicted / published - 1. Where the sources leave a setting open that moves the figure by more
than the tolerance (25 %), each reading is its own row (Qwen-Image's trained timesteps; the MixGRPO GPU).
A named parameter is re-fit only where every reading of an anchor is off by more than 25 % in the same
direction (``refit_decisions``); for a row off by more, the training efficiency (``Assumptions.
train_efficiency``, 1.0: "training at inference efficiency") it would need is recorded. Nothing is tuned
silently. Each record names what the source leaves unknown and what was assumed for it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from digenrl.schedule.cost import GENERATOR  # noqa: E402
from digenrl.sim.assumptions import Assumptions  # noqa: E402
from digenrl.sim.baselines import dancegrpo  # noqa: E402
from digenrl.sim.scenario import Scenario, run_mode  # noqa: E402
from digenrl.sim.presets import (H20, LORA_REPLICATED, MODELS, TESTBEDS, Testbed, Training,  # noqa: E402
                                 Workload, model_preset)
from digenrl.sim.roofline import RooflineCost  # noqa: E402
from digenrl.sim.variants import COMPILED_SPEEDUP, COMPILED_SPEEDUP_BEFORE  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "anchors.json"
TOLERANCE = 0.25
H20_32 = Testbed("H20x32", H20, 32, 200.0, description="32 x H20 96 GB (4 HGX nodes), 200 Gb/s (assumed)")


def _record(name: str, published: float, predicted: float, unit: str, source: str, config: dict,
            unknown: list[str], note: str = "") -> dict:
    err = predicted / published - 1.0
    return {"anchor": name, "published": published, "predicted": predicted, "unit": unit, "error": err,
            "within_tolerance": abs(err) <= TOLERANCE, "source": source, "config": config, "unknown": unknown,
            "note": note, "refit": ""}


def _needed_train_efficiency(step_of, target_step: float) -> float | None:
    """The ``Assumptions.train_efficiency`` at which ``step_of(ratio)`` equals ``target_step`` (bisection on a
    log scale over [0.05, 4], to 0.1 %: the docs quote it to two digits; the step falls as the ratio rises), None
    where no ratio in range reaches it."""
    lo, hi = 0.05, 4.0
    if not step_of(hi) <= target_step <= step_of(lo):
        return None
    while hi / lo > 1.001:  # (12 halvings of the log range ln 80)
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if step_of(mid) > target_step else (lo, mid)
    return (lo * hi) ** 0.5


def flux_single_gpu() -> list[dict]:
    """(a): 28 denoising forwards of one 1024 px sample + its decode on one H100 (no reward)."""
    tb = TESTBEDS["B"]
    w = Workload(1, 1, 1024, 1024, 1, sampling_steps=28, training=LORA_REPLICATED)
    c = RooflineCost(MODELS["flux"], w, tb, 1, 1)
    eager = 28 * c.time("denoise", 1, GENERATOR) + c.time("vae_decode", 1, GENERATOR)
    config = {"model": "FLUX.1-dev", "gpu": tb.gpu.name, "width": 1024, "height": 1024, "steps": 28, "batch": 1,
              "text_tokens": MODELS["flux"].text_tokens, "forwards_per_step": 1,
              "seq_tokens": c.seq, "fwd_tflop": c.fwd_flops / 1e12}
    unknown = ["the prompt's token count (priced at diffusers' max_sequence_length 512, as xDiT's pipeline pads)",
               "whether the decode is in the time (priced in)",
               "in-sample: the H100 efficiency plateau is fitted to BenchmarkFlux's FLUX.1-dev 1024 px 28-step "
               "time (7.11 s, sim.efficiency), so (a) eager is not independent of the model"]
    src = "xDiT docs/performance/flux.md (1 x H100); reproduced in xDiT issue 378 (6.27 / 3.88 s)"
    out = [_record("FLUX.1-dev 1024 px, 28 steps, 1 x H100, eager", 6.71, eager, "s", src, config, unknown)]
    before = eager / COMPILED_SPEEDUP_BEFORE
    note = (f"compiled = eager / sim.variants.COMPILED_SPEEDUP, the generator speed-up of FastGenerators: "
            f"{COMPILED_SPEEDUP_BEFORE:g} (an assumption) before, now {COMPILED_SPEEDUP:.3f} = 6.71 / 4.30, xDiT's "
            f"own eager / compiled ratio; with {COMPILED_SPEEDUP_BEFORE:g} the prediction was {before:.2f} s "
            f"({before / 4.30 - 1:+.0%}, within the tolerance: a cited figure replaced an assumption, no re-fit "
            f"was needed)")
    compiled = _record("FLUX.1-dev 1024 px, 28 steps, 1 x H100, torch.compile", 4.30, eager / COMPILED_SPEEDUP, "s",
                       src, {**config, "compiled_speedup": COMPILED_SPEEDUP}, unknown[:2], note)
    compiled["error_before"] = before / 4.30 - 1
    return out + [compiled]


QWEN_READINGS = (
    (0.2, "T = 10 with an SDE window of 2 trained steps (flow_grpo's pickscore_qwenimage: sample.num_steps = 10, "
          "sde_window_size = 2)"),
    (0.99, "T = 10 with int(0.99 T) = 9 trained steps (flow_grpo's OCR configs: sample.num_steps = 10, "
           "train.timestep_fraction = 0.99)"),
)


def verl_omni_qwen() -> list[dict]:
    """(b): a colocated FlowGRPO step of 512 Qwen-Image samples on 4 H200s, full fine-tuning, no CFG; one row per
    reading of the unknown trained timesteps."""
    tb = TESTBEDS["D"]
    # "without CFG": one forward per step; ~256 prompt tokens (the Qwen2.5-VL features of a short prompt; the
    # adapter's default pads to 512, ``models.specs``)
    model = replace(model_preset("qwen_image"), forwards_per_step=1, text_tokens=256)
    out = []
    for fraction, reading in QWEN_READINGS:
        w = Workload(32, 16, 512, 512, 1, sampling_steps=10, timestep_fraction=fraction, training=Training())

        def step(ratio: float, w=w) -> float:
            s = Scenario(model, tb, w, 4, steps=3, assume=Assumptions(train_efficiency=ratio))
            return run_mode(s, "colocated").result.step_time
        t = step(1.0)
        per_gpu = w.prompts * w.generations / t / 4
        config = {"model": "Qwen-Image-20B", "gpu": tb.gpu.name, "gpus": 4, "images_per_step": 512,
                  "prompts": w.prompts, "generations": w.generations, "width": 512, "height": 512,
                  "sampling_steps": w.sampling_steps, "trained_timesteps": w.trained_timesteps,
                  "forwards_per_step": 1, "training": "full fine-tuning, FSDP over the 4 ranks, recomputation",
                  "mode": "colocated (idealised)", "step_s": t}
        unknown = [f"sampling steps and trained timesteps: this row reads {reading}",
                   "resolution (512 x 512 assumed: flow_grpo's OCR and Qwen-Image configs train at 512)",
                   "the split of the 512 images into prompts x generations (32 x 16 assumed)",
                   "the rollout engine's speed (priced at the roofline's eager efficiency) and the OCR reward's "
                   "cost (priced as a 0.38 TFLOP CLIP-class scorer)"]
        rec = _record(f"VeRL-Omni FlowGRPO Qwen-Image OCR, full FT, no CFG, 4 x H200, S = {w.trained_timesteps}",
                      0.510, per_gpu, "img/GPU/s", "verl-omni docs/algo/performance.md", config, unknown)
        if not rec["within_tolerance"]:
            rec["train_efficiency_to_match"] = _needed_train_efficiency(step, 512 / 0.510 / 4)
        out.append(rec)
    return out


def mixgrpo_dancegrpo() -> list[dict]:
    """(c): DanceGRPO's FLUX step as the MixGRPO paper ran it, on 32 H20 and on 32 H100."""
    w = Workload(32, 12, 720, 720, 1, sampling_steps=25, timestep_fraction=14.5 / 25, training=Training())
    base = dancegrpo("flux")
    out = []
    for tb, note in ((H20_32, "H20 (Tencent Hunyuan's authors; the export-compliant Hopper part)"),
                     (TESTBEDS["B"], "H100 SXM")):
        def step(ratio: float, tb=tb) -> float:
            s = Scenario(MODELS["flux"], tb, w, 32, steps=3, variant=base.variant,
                         assume=Assumptions(train_efficiency=ratio))
            return run_mode(s, "colocated").result.step_time
        t = step(1.0)
        config = {"model": "FLUX.1-dev", "gpu": tb.gpu.name, "gpus": 32, "width": 720, "height": 720,
                  "sampling_steps": 25, "trained_timesteps": w.trained_timesteps, "prompts": 32, "generations": 12,
                  "loop": base.label, "step_s": t}
        unknown = [f"the GPU type: the paper says 32 GPUs; this row reads {note}",
                   "what the iteration time includes (priced: sampling, decode, reward, training, optimizer step)",
                   "the rewards' cost (MixGRPO mixes HPSv2, ImageReward and PickScore: priced as one 0.38 TFLOP "
                   "CLIP-class scorer)",
                   "DanceGRPO's trained timesteps (int((T - 1) x 0.6) = 14 of 25 assumed, the NFE of the paper's "
                   "table)"]
        rec = _record(f"MixGRPO paper: DanceGRPO FLUX step, 32 x {tb.gpu.name}", 291.3, t, "s",
                      "arXiv 2507.21802 (MixGRPO), training overhead of DanceGRPO", config, unknown)
        if not rec["within_tolerance"]:
            rec["train_efficiency_to_match"] = _needed_train_efficiency(step, 291.3)
        out.append(rec)
    return out


def refit_decisions(rows: list[dict]) -> list[str]:
    """Where a re-fit applies: an anchor whose every reading of its unknowns is off by more than the tolerance
    in the same direction. One whose readings bracket the published figure cannot tell the model's error from
    the unknown; its readings and the training efficiency each would need are recorded, nothing is re-fit."""
    out = []
    for key in ("VeRL-Omni", "MixGRPO"):
        rs = [r for r in rows if r["anchor"].startswith(key)]
        errs = [r["error"] for r in rs]
        if all(e > TOLERANCE for e in errs) or all(e < -TOLERANCE for e in errs):
            out.append(f"{key}: every reading is off by more than {TOLERANCE:.0%}: re-fit needed")
        else:
            out.append(f"{key}: readings {', '.join(f'{e:+.0%}' for e in errs)} bracket or meet the published "
                       f"figure: no re-fit (the unknowns, not the model, decide the error)")
    return out


def run_all() -> dict:
    rows = flux_single_gpu() + verl_omni_qwen() + mixgrpo_dancegrpo()
    return {"tolerance": TOLERANCE, "anchors": rows, "refit": refit_decisions(rows)}


def main() -> int:
    res = run_all()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    tmp = RESULTS.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1))
    tmp.replace(RESULTS)
    for a in res["anchors"]:
        need = a.get("train_efficiency_to_match")
        print(f"{a['anchor']}: published {a['published']:g} {a['unit']}, predicted {a['predicted']:.3g} "
              f"({a['error']:+.0%})" + (f"; train_efficiency to match: {need:.2f}" if need else ""))
    for line in res["refit"]:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
