"""Write the presets' pages from the presets themselves: docs/presets.md ("Which GPUs each preset needs": pools,
trainer setting and the memory plan per rank of every ``src/digenrl/configs/*.yaml``) and the table of
docs/scaling.md (each scaled preset's plan on 1, 2 and 4 GPUs, from ``benchmarks/results/preset_scaling.json``).

    python scripts/presets_doc.py            # rewrite both pages (the scaling table from the results file)
    python scripts/presets_doc.py --plan     # first run `digenrl plan` for the scaling table (about a minute of
                                             # CPU per preset) and write benchmarks/results/preset_scaling.json
    python scripts/presets_doc.py --check    # exit 1 if a page is not what this script writes

Every number is computed here: the memory plan (``digenrl.train.memory``, as ``digenrl train`` and ``digenrl
check`` compute it) and the predicted step times of each preset's plan block (written by
``scripts/plan_presets.py``) and of the scaling plans (``digenrl plan``, roofline costs of testbed B).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from doc_check import write_or_check  # noqa: E402

PRESETS_PAGE = ROOT / "docs" / "presets.md"
SCALING_PAGE = ROOT / "docs" / "scaling.md"
SCALING_RESULTS = ROOT / "benchmarks" / "results" / "preset_scaling.json"
SCALED = ("sd35_medium", "flux1_dev")  # the presets the scaling table plans
GPUS = (1, 2, 4)
TESTBED = "B"
GiB = 1 << 30
BEGIN = "<!-- BEGIN scaling table: written by scripts/presets_doc.py from benchmarks/results/preset_scaling.json -->"
END = "<!-- END scaling table -->"


def _setting(cfg, p) -> str:
    t = cfg.train
    parts = [f"LoRA r{cfg.model.lora.rank}" if cfg.model.lora.enabled else "full fine-tuning"]
    if t.sharding == "fsdp":
        n = cfg.runtime.trainers // t.shard_groups
        parts.append(f"FSDP over {n}" + (f" x {t.shard_groups} groups" if t.shard_groups > 1 else ""))
    parts.append({"bf16": "bf16", "fp16": "fp16 + loss scaling"}.get(t.mixed_precision, cfg.model.dtype))
    if t.activation_checkpointing:
        parts.append("recomputation")
    if t.ema_decay is None:
        parts.append("no EMA")
    if cfg.model.options.get("vae_tiling"):
        parts.append("tiled VAE")
    if t.algorithm != "flow_grpo":
        parts.append(t.algorithm)
    return ", ".join(parts)


def _plan_block(path: Path) -> str:
    """The predicted step time of the preset's plan block (``scripts/plan_presets.py``), as written there."""
    text = path.read_text()
    mode = re.search(r"^# plan: testbed (\S+), (\d+) GPUs, mode (\S+)$", text, re.M)
    times = re.findall(r"^# [^\n]*: predicted ([\d.]+) s/step$", text, re.M)
    if not mode or not times:
        return ""
    own = f"{float(times[0]):.1f} s" if mode.group(3) != "colocated" or len(times) == 1 else f"{float(times[-1]):.1f} s"
    return f"{own} on {mode.group(2)} GPUs of testbed {mode.group(1)}"


def preset_rows() -> list[list[str]]:
    from digenrl.config import load_config
    from digenrl.control.run_plan import timestep_plan
    from digenrl.presets import PRESET_DIR, preset_names
    from digenrl.train.memory import generator_bytes, plan_memory
    from digenrl.train.memory_check import chunk_cells, inputs_from_config, resolve_chunk_cells

    out = []
    for name in preset_names():
        path = PRESET_DIR / f"{name}.yaml"
        cfg = load_config(path)
        cfg = resolve_chunk_cells(cfg, len(timestep_plan(cfg, 0).trained))
        p = inputs_from_config(cfg)
        plan = plan_memory(p)
        cells = chunk_cells(cfg)
        rt = cfg.runtime
        gpu = f"{cfg.train.memory_gb:g} GB" if cfg.train.memory_gb else "?"
        if rt.mode == "colocated":
            pools = f"{rt.trainers} x {gpu} (colocated)"
            gen = "(colocated)"
        else:
            pools = f"{rt.generators + rt.trainers} x {gpu} ({rt.generators} + {rt.trainers})"
            gen = f"{sum(generator_bytes(p, rt.fragment_size).values()) / GiB:.1f} GiB"
        per_rank = f" ({cells} cells / rank)" \
            if cfg.train.sharding == "fsdp" else ""
        cfg_note = " (CFG)" if p.forwards_per_cell == 2 else ""
        out.append([f"`{name}`", pools, rt.mode, _setting(cfg, p), f"{plan.state / GiB:.1f} GiB",
                    f"{plan.activations(1) / GiB:.1f} GiB{cfg_note}",
                    f"{cfg.train.chunk_generations} x {cfg.train.chunk_timesteps}{per_rank}",
                    f"{plan.total(cells) / GiB:.1f} GiB", gen, _plan_block(path)])
    return out


def presets_page() -> str:
    head = ["preset", "GPUs (generators + trainers)", "mode", "trainer setting", "state / trainer rank",
            "activations per cell", "chunk", "planned peak / trainer rank", "generator / GPU",
            "predicted step (plan block)"]
    lines = ["# Presets: which GPUs each needs", "",
             "<!-- generated by scripts/presets_doc.py from src/digenrl/configs/*.yaml; do not edit by hand -->", "",
             "The shipped presets are in the package (`src/digenrl/configs/`; the repository's `configs/` links "
             "there) and are used by name: `digenrl check --config preset:flux1_dev` prints one resolved, with its "
             "memory plan and split, without starting anything; `digenrl train --config preset:flux1_dev "
             "model.path=/models/FLUX.1-dev ...` runs it. Each preset is its peer's recipe key by key (the "
             "differences are marked `DEVIATION` in the file and listed in [Recipes](recipes.md)).", "",
             "Every preset is planned for GPUs of `train.memory_gb`. The memory plan (`digenrl.train.memory`) adds, "
             "per trainer rank: weights, gradients, AdamW state, EMA, the KL reference (full fine-tuning with "
             "`beta_kl > 0` only), the float64 gradient sums of `train.grad_sum` (where in effect), the copies of "
             "the trainable weights DiffusionNFT's soft old policy and `train.old_logprob=recompute`'s step-start "
             "snapshot keep, a whole unsharded policy with `tuning.tag_inference_copy`, autocast weight copies, "
             "the FSDP working set, the VAE, text encoders (none with a "
             "full prompt cache), a 3 GiB reserve, and the activations of one training chunk; `train.chunk_cells: "
             "auto` picks the largest chunk that fits. A generator holds a 16-bit replica, the fp32 VAE, text "
             "encoders only without a full prompt cache, and the sampling activations of one fragment (VAE "
             "decoding is bounded by `model.options.vae_batch` / `vae_tiling`, not planned). The split, fragment "
             "size and chunk shape are each preset's `digenrl plan` on its testbed (`scripts/plan_presets.py` "
             "writes them into the preset's plan block with the predicted step time in the last column).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in preset_rows()]
    lines += ["", "To run a preset on fewer or smaller GPUs, see [Scaling a preset down](scaling.md)."]
    return "\n".join(lines) + "\n"


def run_plans() -> dict:
    """``digenrl plan`` of each scaled preset on 1, 2 and 4 GPUs of the testbed (1 GPU: colocated)."""
    import contextlib
    import io
    import tempfile

    from digenrl.sim.plan_cli import main as plan

    out = {"testbed": TESTBED, "presets": {}}
    for name in SCALED:
        rows = []
        for gpus in GPUS:
            sets = ["--set", "runtime.mode=colocated", "--set", "runtime.generators=1", "--set",
                    "runtime.trainers=1"] if gpus == 1 else []
            with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()) as buf:
                rc = plan(["--config", f"preset:{name}", "--testbed", TESTBED, "--gpus", str(gpus), "--out",
                           str(Path(tmp) / "plan.yaml"), "--json", *sets])
            if rc != 0:
                rows.append({"gpus": gpus, "refused": f"exit {rc}"})
                continue
            res = json.loads(buf.getvalue())
            rows.append({"gpus": gpus, "mode": res["mode"], "plan": res["best"]["label"],
                         "step_time_s": res["best"]["step_time_s"],
                         "colocated_s": (res.get("colocated") or {}).get("step_time_s"),
                         "command": f"digenrl plan --config preset:{name} --testbed {TESTBED} --gpus {gpus} "
                                    f"--out plan.yaml" + (" --set runtime.mode=colocated --set runtime.generators=1"
                                                          " --set runtime.trainers=1" if gpus == 1 else "")})
        out["presets"][name] = rows
    return out


def scaling_table(results: dict) -> str:
    lines = [BEGIN, "", f"`digenrl plan` on testbed {results['testbed']} (roofline costs, steady step time in virtual "
             "time; the preset's own step size, P x G), from `benchmarks/results/preset_scaling.json`:", "",
             "| preset | GPUs | mode | plan | predicted step | colocated on the same GPUs |", "|---|---|---|---|---|---|"]
    for name, rows in results["presets"].items():
        for r in rows:
            if "refused" in r:
                lines.append(f"| `{name}` | {r['gpus']} | refused ({r['refused']}) | | | |")
                continue
            colo = f"{r['colocated_s']:.0f} s" if r.get("colocated_s") else "(is colocated)"
            lines.append(f"| `{name}` | {r['gpus']} | {r['mode']} | {r['plan']} | {r['step_time_s']:.0f} s | {colo} |")
    lines += ["", END]
    return "\n".join(lines)


def scaling_page(results: dict) -> str:
    text = SCALING_PAGE.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{SCALING_PAGE}: the scaling table markers are missing")
    head, rest = text.split(BEGIN, 1)
    return head + scaling_table(results) + rest.split(END, 1)[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a page is out of date")
    ap.add_argument("--plan", action="store_true", help="run the scaling plans first (writes the results file)")
    args = ap.parse_args(argv)
    if args.plan:
        SCALING_RESULTS.write_text(json.dumps(run_plans(), indent=1) + "\n")
        print(f"wrote {SCALING_RESULTS.relative_to(ROOT)}")
    results = json.loads(SCALING_RESULTS.read_text())
    rc = write_or_check(PRESETS_PAGE, presets_page(), args.check, "scripts/presets_doc.py", ROOT)
    return rc | write_or_check(SCALING_PAGE, scaling_page(results), args.check, "scripts/presets_doc.py", ROOT)


if __name__ == "__main__":
    sys.exit(main())
