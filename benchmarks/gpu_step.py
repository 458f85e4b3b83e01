"""The simulator checked against one GPU: DigenRL's own colocated step, measured on the device and predicted from the
op costs its calibration timed there; then the generator pool priced from op costs timed on the same device.

The GPU figures of docs/ come from the simulator fed with op costs. On this project's CPU the simulator predicts a
measured step from the run's own calibration within a few percent (``pipeline_cpu.py``, ``fast_pool_cpu.py``);
this script asks the same of a GPU. One GPU holds one worker of a run, so what can be measured end to end is the
colocated mode in one process (``digenrl train``'s in-process executor, no Ray: the lent device has none).

* ``colocated``: per workload, one run of ``runtime.mode=colocated`` on 1 worker with
  ``runtime.calibration.when=always`` (its ops timed on the worker before step 1, ``runtime.calibrate``) and
  ``--steps`` steps: the steady step (the publishes of the first and last step over K - 1) against the
  simulator's prediction from that calibration and from the op costs the run itself showed (its trace):
  ``pipeline_cpu.one_run``, the CPU benchmarks' own measurement. Workloads: ``flow_grpo`` is Flow-GRPO's FLUX
  recipe's step shape (``configs/flux1_dev.yaml``: T = 6, ``int(6 x 0.99)`` = 5 trained, LoRA rank 64 / alpha
  128, bf16 autocast over fp32 LoRA masters) at 2 prompts x 8 generations; ``mixgrpo`` the generation-heavy
  shape of ``fast_pool_cpu.py`` (T = 10, 2 trained).
* ``pool``: a 1 generator + 1 trainer rank plan (``gap_tsp_tag``, fragments of 4) built in this process on the
  same GPU, the generator holding its inference copy (``generator.merge_lora``, ``generator.compile``), its ops
  calibrated; the simulator prices ``gap_tsp_tag`` and ``full`` (stale cap 0.25) on two such GPUs against
  colocated on two (the ``colocated`` run's calibration). A prediction, not a measurement: one GPU cannot run two
  pools at once. Neither calibration times an all-reduce or a copy between GPUs (one device), so both sides
  price them at what one process shows.

The model is the FLUX.1 architecture with random weights (``flux_random``) at the real widths with ``--units``
block units (1 double + 2 single blocks each), the real FLUX VAE, 512 px, 512 text tokens of a prompt cache, the
JPEG-incompressibility reward (no download). ``--tiny`` runs the same on the CPU at tiny widths, the generator's
copy merged but not compiled unless ``--compile`` (the test suite's dry run; tests/runtime/
test_fast_generator_runtime.py compiles it); its numbers say nothing about a GPU. If the compiled copy fails on a
device, the error is recorded (``compile_error``) and the pool is priced with the merged copy.

    python benchmarks/gpu_step.py --out DIR            # on a GPU (not run on one yet; gpu_acceptance.sh allows 240 s)
    python benchmarks/gpu_step.py --tiny --out DIR     # anywhere (CPU): tiny widths
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PROMPTS = ["a red cube on a table", "a cat in the snow"]
WORKLOADS = {  # name -> the step's shape (on top of ``base``)
    "flow_grpo": ["sampler.num_steps=6", "train.timestep_fraction=0.99"],
    "mixgrpo": ["sampler.num_steps=10", "train.timestep_fraction=0.2"],
}
FAST = ["generator.merge_lora=true", "generator.compile=default"]  # the generator's inference copy
ONE_WORKER = ["runtime.mode=colocated", "runtime.trainers=1", "runtime.generators=1"]


def base(tiny: bool, device: str, model: list[str]) -> list[str]:
    """The overrides every run shares: the saved model, the task, the reward, the step's size and precision."""
    px, tokens = (32, 8) if tiny else (512, 512)
    out = [*model, "model.kind=flux", f"model.device={device}", "model.lora.enabled=true",
           f"model.options={{height: {px}, width: {px}, max_sequence_length: {tokens}}}", "task.name=text",
           "reward={jpeg_incompressibility: {weight: 1.0}}", "sampler.cfg_scale=3.5", "train.prompts_per_step=2",
           "train.generations=8", "runtime.fragment_size=4", "train.ema_decay=null", "eval.num_prompts=2",
           "eval.grid_prompts=2", "eval.every=0", "log.progress=false"]
    if tiny:
        return out + ["model.lora.rank=4", "model.lora.alpha=8", "model.dtype=float32", "train.mixed_precision=none"]
    return out + ["model.lora.rank=64", "model.lora.alpha=128", "model.dtype=bfloat16", "train.mixed_precision=bf16"]


def save_model(root: Path, tiny: bool, units: int) -> list[str]:
    """The random-weight FLUX pipeline with ``units`` block units under ``root`` (``flux_random.save_pipeline``)."""
    import torch
    from flux_random import flux_transformer, flux_vae, save_pipeline

    torch.manual_seed(0)
    tr = flux_transformer(units, 2 * units, tiny=tiny)
    vae = flux_vae(tiny=tiny)
    if not tiny:  # saved (and loaded by the run) in bf16: half the bytes to write
        tr, vae = tr.to(torch.bfloat16), vae.to(torch.bfloat16)
    return save_pipeline(root, tr, vae, PROMPTS, 8 if tiny else 512)


def stage_colocated(a, shared: list[str], work: Path, log) -> dict:
    import pipeline_cpu

    out = {}
    for name, shape in WORKLOADS.items():
        row = pipeline_cpu.one_run([*shared, *shape, f"steps={a.steps}"], "colocated", work / name, a.repeats, log,
                                   pools=ONE_WORKER, ray=False)
        row["error_calibration"] = row["sim_step_time_s"] / row["step_time_s"] - 1
        row["error_own_costs"] = row["sim_own_costs_s"] / row["step_time_s"] - 1
        row["profile"] = json.loads((work / name / "profile.json").read_text())
        out[name] = row
    return out


def stage_pool(a, shared: list[str], work: Path, colocated: dict, log) -> dict:
    """The generator pool on two GPUs of this kind, priced from op costs calibrated here (module docstring)."""
    from pipeline_cpu import sim_steady_step

    from digenrl.config import load_config
    from digenrl.control.profile import ProfileCost
    from digenrl.control.run_plan import plan_run
    from digenrl.runtime.calibrate import calibrate
    from digenrl.runtime.local import start_local_pools

    fast = FAST if a.compile else FAST[:1]
    out: dict = {"generator": fast}

    def calibrated(wl: list[str]):
        run = plan_run(load_config(None, wl + fast + ["runtime.mode=gap_tsp_tag", "runtime.trainers=1",
                                                      "runtime.generators=1"]))
        pools = start_local_pools(run)
        try:
            return run, calibrate(run, pools, repeats=a.repeats)
        finally:
            pools.kill()

    for name, shape in WORKLOADS.items():
        wl = [*shared, *shape, f"steps={a.steps}", f"tuning.calibration_repeats={a.repeats}"]
        t0 = time.perf_counter()
        try:
            run, prof = calibrated(wl)
        except Exception as e:  # noqa: BLE001 - a compile that fails on this device: priced merged, not compiled
            if len(fast) == 1:
                raise
            out["compile_error"], fast = f"{type(e).__name__}: {e}"[:500], fast[:1]
            out["generator"] = fast
            log(f"pool {name}: the compiled copy failed ({out['compile_error'][:200]}); merged only")
            run, prof = calibrated(wl)
        log(f"pool {name}: calibrated in {time.perf_counter() - t0:.1f} s")
        cost = ProfileCost.from_dict(prof)
        co_cost = ProfileCost.from_dict(colocated[name]["profile"])
        full = plan_run(load_config(None, wl + fast + ["runtime.mode=full", "runtime.trainers=1",
                                                       "runtime.generators=1", "runtime.max_stale_fraction=0.25"])).plan
        co2 = plan_run(load_config(None, wl + ["runtime.mode=colocated", "runtime.trainers=2",
                                               "runtime.generators=1"])).plan
        steps = {"colocated_2": sim_steady_step(co2, co_cost), "gap_tsp_tag_fast_1_1": sim_steady_step(run.plan, cost),
                 "full_fast_1_1": sim_steady_step(full, cost)}
        out[name] = {"predicted_step_s": steps,
                     "speedup_vs_colocated": {k: steps["colocated_2"] / v for k, v in steps.items()},
                     "profile": prof}
        log(f"pool {name}: " + ", ".join(f"{k} {v:.3f} s" for k, v in steps.items()))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for step.json")
    ap.add_argument("--tiny", action="store_true", help="tiny widths on the CPU (a dry run)")
    ap.add_argument("--units", type=int, default=1, help="FLUX block units (1 double + 2 single blocks each)")
    ap.add_argument("--steps", type=int, default=5, help="steps per run (>= 3: a steady window)")
    ap.add_argument("--repeats", type=int, default=2, help="calibration repeats per op")
    ap.add_argument("--stages", default="colocated,pool")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="compile the generator's copy in the pool stage (default: on a GPU; a dry run merges only, "
                         "the compile taking longer than the rest). A compile that fails is recorded and the pool "
                         "priced merged only")
    a = ap.parse_args(argv)
    a.compile = not a.tiny if a.compile is None else a.compile
    stages = [s for s in a.stages.split(",") if s]
    bad = [s for s in stages if s not in ("colocated", "pool")]
    if bad or a.steps < 3 or a.units < 1 or a.repeats < 1:
        print(f"gpu_step: error: --stages takes colocated,pool (got {', '.join(bad) or a.stages}); --steps >= 3, "
              f"--units and --repeats >= 1", file=sys.stderr)
        return 2
    if "pool" in stages and "colocated" not in stages:
        print("gpu_step: error: the pool stage prices colocated from the colocated stage's calibration: run both",
              file=sys.stderr)
        return 2
    import tempfile

    import torch

    device = "cpu" if a.tiny or not torch.cuda.is_available() else "cuda"
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__, "tiny": a.tiny, "units": a.units, "steps": a.steps,
            "calibration_repeats": a.repeats, "date": time.strftime("%Y-%m-%d")}
    report: dict = {"format": "digenrl-gpu-step", "meta": meta, "stages": {}}
    path = out_dir / "step.json"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = save_model(work, a.tiny, a.units)
        shared = base(a.tiny, device, model)
        report["workloads"] = {"base": shared[len(model):], **WORKLOADS}  # (not the temporary model paths)
        for name in stages:
            s0 = time.perf_counter()
            try:
                res = (stage_colocated(a, shared, work, log) if name == "colocated" else
                       stage_pool(a, shared, work, report["stages"]["colocated"]["result"], log))
                report["stages"][name] = {"ok": True, "seconds": time.perf_counter() - s0, "result": res}
            except Exception as e:  # noqa: BLE001 - recorded; what finished is kept
                report["stages"][name] = {"ok": False, "seconds": time.perf_counter() - s0,
                                          "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
            log(f"{name}: {'ok' if report['stages'][name]['ok'] else report['stages'][name]['error']}")
            path.write_text(json.dumps(report, indent=1))
            if not report["stages"][name]["ok"]:
                break
    print(summary(report))
    return 0 if all(s["ok"] for s in report["stages"].values()) else 1


def summary(report: dict) -> str:
    """One line per workload: the measured colocated step against the simulator's, and the pool's prediction."""
    lines = [f"gpu_step on {report['meta']['device']}:"]
    st = report["stages"]
    for name, row in (st.get("colocated", {}).get("result") or {}).items():
        line = (f"  {name}: colocated step measured {row['step_time_s']:.3f} s, simulated from its calibration "
                f"{row['sim_step_time_s']:.3f} s ({row['error_calibration']:+.1%}), from its own op costs "
                f"{row['sim_own_costs_s']:.3f} s ({row['error_own_costs']:+.1%})")
        pool = (st.get("pool", {}).get("result") or {}).get(name)
        if pool:
            sp = pool["speedup_vs_colocated"]
            line += (f"; predicted on two such devices, against colocated on two: gap_tsp_tag fast "
                     f"{sp['gap_tsp_tag_fast_1_1']:.2f}x, full fast {sp['full_fast_1_1']:.2f}x")
        lines.append(line)
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
