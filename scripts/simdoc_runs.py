"""The simulator runs behind docs/simulation.md: every number of the page comes out of ``run_all``'s dict.

This is the one place that imports the simulator's drivers (``digenrl.sim.cli`` / ``planner`` /
``executor``); the rest of the doc scripts only read the results.
"""

from __future__ import annotations

import time
from dataclasses import replace

from digenrl.schedule import MODES as ALL_MODES
from digenrl.sim.cli import rows_of, run_modes
from digenrl.sim.efficiency import MEASUREMENTS, fitted, plateau, residuals
from digenrl.sim.scenario import run_mode

from digenrl.sim.scenario import Scenario as Setup
from digenrl.sim.presets import (H20, H100, L40S, LORA_REPLICATED, MODELS, TESTBEDS, WORKLOADS, model_preset, tokens_per_sample,
                                 workload_preset)
from digenrl.sim.roofline import InfeasibleError, RooflineCost

MODES = list(ALL_MODES)
ABLATION = [("hunyuan", "A"), ("hunyuan", "B"), ("hunyuan", "C"), ("wan", "B"), ("wan", "C")]
IMAGE = [("flux", "A"), ("flux", "B"), ("flux", "C"), ("qwen-image", "B"), ("qwen-image", "C")]
T_VALUES = [20, 30, 40]
LORA = [("flux", "B"), ("flux", "A"), ("wan", "B"), ("hunyuan", "B")]
HETERO = ["hunyuan", "wan", "flux"]


def setup(model: str, tb: str, steps: int, T: int = 20, training=None, gpus: int | None = None) -> Setup:
    w = replace(workload_preset(model), sampling_steps=T)
    if training is not None:
        w = replace(w, training=training)
    return Setup(model_preset(model), TESTBEDS[tb], w, gpus or TESTBEDS[tb].total, steps=steps)


def _rows(s: Setup) -> list[dict]:
    return rows_of(run_modes(s, MODES, None), MODES)


def _costs(model: str, tb: str, n_gen: int, n_train: int, training=None) -> dict:
    w = workload_preset(model) if training is None else replace(workload_preset(model), training=training)
    out: dict = {"model": model, "testbed": tb, "lora": w.training.lora_rank > 0}
    try:
        out.update(RooflineCost(model_preset(model), w, TESTBEDS[tb], n_gen, n_train).describe())
    except InfeasibleError as e:
        out["infeasible"] = str(e)
    try:
        c = RooflineCost(model_preset(model), w, TESTBEDS[tb], 0, TESTBEDS[tb].total, colocated=True).describe()
        out.update({k: v for k, v in c.items() if k.startswith("coloc_")})
    except InfeasibleError as e:
        out["coloc_infeasible"] = str(e)
    return out


def _split_costs(model: str, tb: str, rows: list[dict], training=None) -> dict:
    """Switch and publish costs at the split, publish path, shard groups and TAG copy the planner chose for
    ``full``."""
    full = next(r for r in rows if r["mode"] == "full")
    t = training if training is not None else workload_preset(model).training
    chosen = replace(t, publish=full.get("publish") or t.publish, tag_copy=bool(full.get("tag_copy", t.tag_copy)),
                     shard_groups=full.get("shard_groups", 1) if t.sharded else 1)
    return _costs(model, tb, full["gen_gpus"], full["trainer_gpus"], chosen)


def efficiency_results() -> dict:
    plateaus, (a, b) = fitted()
    kinds = {m.gpu.name: m.gpu for m in MEASUREMENTS}
    kinds.update({g.name: g for g in (L40S, H100, H20)})
    return {"residuals": residuals(),
            "plateaus": [{"gpu": k, "plateau": plateau(g)[0], "how": plateau(g)[1],
                          "flop_per_byte": g.bf16_tflops * 1e12 / (g.hbm_gbs * 1e9)} for k, g in kinds.items()],
            "regression": {"a": a, "b": b}}


def flops_table() -> list[dict]:
    out = []
    for key, m in MODELS.items():
        a = m.archi
        n_img, _ = tokens_per_sample(m, WORKLOADS[key])
        per = a.forward_flops(n_img, m.text_tokens)
        seq = n_img + (m.text_tokens if m.joint_text else 0)
        naive = 2.0 * a.params * seq + a.attention_flops(n_img, m.text_tokens)
        s = a.streams
        out.append({"model": key, "params": a.params, "img": s.img, "txt": s.txt, "joint": s.joint,
                    "sample": s.sample, "n_img": n_img, "n_txt": m.text_tokens, "fwd_tflop": per / 1e12,
                    "naive_tflop": naive / 1e12, "attn_share": a.attention_flops(n_img, m.text_tokens) / per,
                    "lora64": a.lora_params(64)})
    return out


def static_inputs() -> dict:
    """The inputs the page states (workloads, testbeds, training presets)."""
    from digenrl.sim.presets import FULL_SHARDED
    from digenrl.sim.roofline import HOST_COPY_GBS

    wl = {k: {"prompts": w.prompts, "generations": w.generations, "width": w.width, "height": w.height,
              "frames": w.frames} for k, w in WORKLOADS.items()}
    t = FULL_SHARDED
    from digenrl.sim.assumptions import DEFAULT

    cost_model = (f"collectives priced by where their ranks sit (`sim.comm`: NVLink inside a node, {TESTBEDS['B'].node_gpus} "
                  "GPUs per node, one NIC per GPU across nodes, the slowest node's bus bandwidth); "
                  f"{DEFAULT.exposed_comm:g} of the communication overlapped with compute left exposed; attention's "
                  f"backward at {DEFAULT.attn_backward:g}x its forward (FlashAttention-2); training at "
                  f"{DEFAULT.train_efficiency:g}x the fitted inference efficiency")
    return {"cost_model": cost_model, "workloads": wl, "testbeds": {k: tb.description for k, tb in TESTBEDS.items()},
            "training": (f"{'LoRA r=' + str(t.lora_rank) if t.lora_rank else 'full fine-tuning'}, "
                         f"{'FSDP full sharding' if t.sharded else 'replicated'} over the trainer pool, "
                         f"{'activation recomputation' if t.recompute else 'no recomputation'}, bf16 with fp32 "
                         "master weights and Adam moments; prompt embeddings cached"),
            "publish": (f"the path the planner picks per mode (`runtime.publish`): the Ray object store from trainer "
                        f"rank 0 (device -> host over PCIe, put at {HOST_COPY_GBS:.0f} GB/s host copy, one fetch per "
                        "generator node at one NIC's rate, load over PCIe), a link-rate broadcast from rank 0 "
                        "the generators join (both after the shard group gathers the full state), or a stream of "
                        "every rank's own shards the generators join while the trainers go on (each rank sends 1/g "
                        "of the bytes, in the final commit). The FSDP trainer pool is one shard group, or k of them where the planner "
                        "picks hybrid sharding (each a data-parallel replica, the commit all-reducing the gradient "
                        "shards across them), as the runtime runs it: each chunk is a collective split over its ranks (its shape chosen by the makespan of the "
                        "group's actual tiles on those ranks, partial rounds included) and every chunk's backward "
                        "reduce-scatters the gradients, so the commit only steps the shards. A TAG action of the "
                        "group is a gang of up to one pending fragment per rank of the head prompt group, generated "
                        "data-parallel; its forwards either gather the shards or, where the planner finds it faster "
                        "and memory allows, run on a bf16 inference copy gathered once per switch "
                        "(`tuning.tag_inference_copy`). The planner (`sim.planner`) probes the splits and settings "
                        "(4 steps each, 8 in `full`) and, of the candidates it probed, keeps the fastest over the "
                        "run's own steps (makespan / steps: a short probe's steady step can rank them otherwise).")}


def run_all(steps: int, log=print) -> dict:
    t0 = time.perf_counter()
    out: dict = {"steps": steps, "runs": [], "lora": [], "hetero": [], "costs": []}
    out["static"] = static_inputs()
    out["efficiency"] = efficiency_results()
    out["flops"] = flops_table()
    for model, tb in ABLATION + IMAGE:
        for T in (T_VALUES if (model, tb) in ABLATION else [20]):
            rows = _rows(setup(model, tb, steps, T))
            out["runs"].append({"model": model, "testbed": tb, "T": T, "rows": rows})
            if T == 20:
                out["costs"].append(_split_costs(model, tb, rows))
            log(f"{model} {tb} T={T} [{time.perf_counter() - t0:.0f}s]")
    for model, tb in LORA:
        try:
            rows = _rows(setup(model, tb, steps, training=LORA_REPLICATED))
        except Exception as e:  # noqa: BLE001 - the page reports a configuration that does not fit
            out["lora"].append({"model": model, "testbed": tb, "error": str(e)})
            continue
        out["lora"].append({"model": model, "testbed": tb, "T": 20, "rows": rows,
                            "costs": _split_costs(model, tb, rows, LORA_REPLICATED)})
        log(f"lora {model} {tb} [{time.perf_counter() - t0:.0f}s]")
    for model in HETERO:
        out["hetero"].append(hetero(model, steps))
        log(f"hetero {model} [{time.perf_counter() - t0:.0f}s]")
    return out


def hetero(model: str, steps: int) -> dict:
    """DigenRL on all 48 GPUs of A+C against every colocated baseline, with GPU counts for per-GPU rates."""
    rows = _rows(setup(model, "A+C", steps))
    full = next(r for r in rows if r["mode"] == "full")
    tag = next(r for r in rows if r["mode"] == "gap_tsp_tag")
    base = []
    for tb, gpus in (("A", 32), ("C", 16)):
        try:
            r = run_mode(setup(model, tb, steps), "colocated")
            base.append({"where": f"{gpus} x {TESTBEDS[tb].gpu.name}", "gpus": gpus,
                         "step_time_s": r.result.step_time})
        except Exception as e:  # noqa: BLE001
            base.append({"where": f"{gpus} x {TESTBEDS[tb].gpu.name}", "gpus": gpus, "error": str(e)})
    lock = next(r for r in rows if r["mode"] == "colocated")
    base.append({"where": f"chosen by the planner: {lock['note']}", "gpus": lock["trainer_gpus"],
                 "step_time_s": lock["step_time_s"]})
    disagg_same = {}
    for tb, gpus in (("A", 32), ("C", 16)):
        try:
            rr = rows_of(run_modes(setup(model, tb, steps), ["full"], None), ["full"])[0]
            disagg_same[tb] = {"gpus": gpus, "step_time_s": rr["step_time_s"]}
        except Exception as e:  # noqa: BLE001
            disagg_same[tb] = {"gpus": gpus, "error": str(e)}
    return {"model": model, "rows": rows, "full": full, "tag": tag, "baselines": base, "full_homog": disagg_same}
