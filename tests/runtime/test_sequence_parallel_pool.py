"""``train.sequence_parallel`` under the Ray runtime: lanes of 2 trainer ranks split every cell's sequence, and the
run still ends with the I1 reference's parameters (I1; docs/sequence_parallel.md).

Models: a tiny random Wan2.1 (diffusers' own context-parallel plan) and HunyuanVideo (DigenRL's plan), full fine-
tuning, 2-frame latent videos. Oracle: the I1 reference (``tests/reference``) in one process, unsplit (same config and seed),
compared per tensor (1e-5 relative) without the attention key biases, whose exact gradient is 0 (softmax ignores
them: Adam turns their rounding noise into lr-sized steps of random sign in any two runs that round differently),
and over the whole state (global relative error, key biases included).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

import tiny_diffusers as td  # noqa: E402

RTOL = 1e-5
TEXTS = ["a red cat", "a big dog"]
FAMILIES = {  # save, options, cond shapes, masks, cfg scale
    "wan": (td.save_wan, "{height: 16, width: 16, frames: 3}", {"prompt_embeds": (6, 16)}, None, 4.0),
    "hunyuan_video": (td.save_hunyuan_video, "{height: 16, width: 16, frames: 5}",
                      {"prompt_embeds": (6, 16), "pooled_prompt_embeds": (8,)}, {"prompt_mask": 4}, 6.0),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return make_models(tmp_path_factory.mktemp("sp_models"))


def make_models(root: Path) -> dict[str, list[str]]:
    """The tiny models, their prompt caches and the prompt file under ``root``: family -> config overrides."""
    prompts = root / "prompts.txt"
    prompts.write_text("\n".join(TEXTS) + "\n")
    out = {}
    for name, (save, options, shapes, masks, cfg) in FAMILIES.items():
        cache = root / f"{name}-cache"
        td.random_cache(cache, f"{name}-test", TEXTS + [""], shapes, masks=masks)
        out[name] = ["model.kind=" + name, f"model.path={save(root / name)}", f"model.prompt_cache_dir={cache}",
                     f"model.options={options}", f"sampler.cfg_scale={cfg}", "task.name=text",
                     f"task.prompts_file={prompts}"]
    return out


COMMON = ["reward={jpeg_incompressibility: {weight: 1.0}}", "steps=3", "train.prompts_per_step=2",
          "train.generations=2", "sampler.num_steps=4", "train.timestep_fraction=0.5", "train.lr=3e-3",
          "train.ema_decay=null", "train.chunk_generations=2", "train.chunk_timesteps=1", "runtime.fragment_size=1",
          "eval.num_prompts=2", "eval.grid_prompts=2", "eval.every=0", "log.progress=false"]


def _cfg(models, family, run_dir, *over):
    from digenrl.config import load_config

    return load_config(None, [f"run_dir={run_dir}", *models[family], *COMMON, *over])


_REFS: dict = {}
_EVALS: dict = {}


def reference(models, family, tmp_path_factory, *math):
    """The I1 reference's trainable parameters after the steps (``tests/reference``, one process, the unsplit
    model; its eval weights: the EMA's where it keeps one), and the initial ones (cached per family and math
    overrides)."""
    key = (family, *math)
    if key not in _REFS:
        from reference import Reference

        from digenrl.train.evaluate import evaluate

        cfg = _cfg(models, family, tmp_path_factory.mktemp("ref"), *math)
        ref = Reference(cfg)
        init = {k: v.detach().clone() for k, v in ref.named.items()}
        for k in range(cfg.steps):
            ref.step(k)
        with ref.holding(ref.ema):
            _REFS[key] = ({k: v.detach().clone() for k, v in ref.named.items()}, init)
            # the final eval a run reports (its eval weights, its prompts and seeds)
            _EVALS[key] = evaluate(ref.policy, ref.task.eval_prompts(cfg.eval.num_prompts), ref.reward, ref.sampler,
                                   run_seed=cfg.seed, num_steps=cfg.sampler.eval_num_steps)[0]
    return _REFS[key]


def _errors(got: dict, ref: dict) -> tuple[float, float]:
    assert set(got) == set(ref)
    key_bias = ("to_k.bias", "add_k_proj.bias")
    per = max(float((got[k] - ref[k]).norm() / ref[k].norm().clamp_min(1e-12)) for k in ref if not k.endswith(key_bias))
    glob = (sum(float((got[k] - ref[k]).square().sum()) for k in ref)
            / sum(float(ref[k].square().sum()) for k in ref)) ** 0.5
    return per, glob


def _run(cfg, ref_init):
    from safetensors.torch import load_file

    from digenrl.runtime.driver import run_training

    ref, init = ref_init
    summary = run_training(cfg, ray=True)
    assert summary["audit_violations"] == [] and summary["version"] == cfg.steps
    got = load_file(str(Path(cfg.run_dir) / "checkpoint.safetensors"))
    per, glob = _errors(got, ref)
    print(f"max relative error per tensor {per:.2e}, global {glob:.2e}")
    assert per <= RTOL and glob <= RTOL, (per, glob)
    assert _errors(init, ref)[0] > 100 * RTOL  # the run really moved the weights
    return summary


def _rows(run_dir) -> set[str]:
    trace = json.loads((Path(run_dir) / "trace.json").read_text())
    return {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}


SP2 = ["runtime.trainers=2", "train.sequence_parallel=2"]


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_colocated_lane_matches_reference(ray_local, models, tmp_path, tmp_path_factory, family):
    """Colocated: one lane of 2 ranks generates (both run every forward, the lead reports) and trains."""
    cfg = _cfg(models, family, tmp_path / "run", "runtime.mode=colocated", *SP2)
    _run(cfg, reference(models, family, tmp_path_factory))
    assert _rows(tmp_path / "run") == {"sp0"}  # the scheduler sees one worker: the lane
    traj = [json.loads(x) for x in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    assert len(traj) == cfg.steps * cfg.train.prompts_per_step * cfg.train.generations  # reported once each


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_tag_on_a_lane_matches_reference(ray_local, models, tmp_path, tmp_path_factory, family):
    """gap_tsp_tag: the lane trains chunks and takes TAG fragments (greedy, so that it surely does)."""
    cfg = _cfg(models, family, tmp_path / "run", "runtime.mode=gap_tsp_tag", *SP2, "runtime.tag_policy=greedy",
               "tuning.calibration_repeats=1")
    _run(cfg, reference(models, family, tmp_path_factory))
    assert _rows(tmp_path / "run") == {"gen0", "sp0"}
    traj = [json.loads(x) for x in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    assert len(traj) == cfg.steps * cfg.train.prompts_per_step * cfg.train.generations
    assert any(t["worker"] == "sp0" and t["tag"] for t in traj), traj  # the lane generated (TAG)
    assert torch is not None


@pytest.mark.slow
@pytest.mark.parametrize("copy", [False, True], ids=["gathers", "inference_copy"])
def test_fsdp_shard_group_of_two_lanes_matches_reference(ray_local, models, tmp_path, tmp_path_factory, copy):
    """FSDP over 4 ranks (one shard group) holding 2 lanes of 2: the blocks are sharded over all 4 ranks, each lane
    trains its share of a chunk's cells, and a TAG gang of 2 fragments gives each lane one (its forwards gathering
    the shards, or on an unsharded inference copy whose sequence the lane splits too); the per-chunk
    reduce-scatter over the 4 ranks adds the lanes' partial gradients."""
    from digenrl.observe.trace import read_chrome_trace

    cfg = _cfg(models, "wan", tmp_path / "run", "runtime.mode=gap_tsp_tag", "runtime.trainers=4",
               "train.sharding=fsdp", "train.sequence_parallel=2", "runtime.tag_policy=greedy",
               "tuning.calibration_repeats=1", "runtime.trainer_resources={CPU: 0.75}",
               f"tuning.tag_inference_copy={copy}")
    _run(cfg, reference(models, "wan", tmp_path_factory))
    assert _rows(tmp_path / "run") == {"gen0", "shard0"}
    tags = [s for s in read_chrome_trace(tmp_path / "run" / "trace.json") if s.kind == "tag"]
    assert any(" x2 " in f" {s.label} " for s in tags), [s.label for s in tags]  # a gang: one fragment per lane


MODES = {  # I1 in every on-policy mode (colocated and gap_tsp_tag above): lanes of 2 trainer ranks
    "naive": ["runtime.mode=naive", *SP2],
    "gap-broadcast": ["runtime.mode=gap", *SP2, "runtime.publish=broadcast"],  # rank 0 sends, its follower not
    # two lanes sp0, sp1 (TSP spreads the chunks over them; the commit sums 4 ranks); rank 0 alone streams
    "gap_tsp-2lanes-stream": ["runtime.mode=gap_tsp", "runtime.trainers=4", "train.sequence_parallel=2",
                              "runtime.publish=stream", "runtime.trainer_resources={CPU: 0.75}"],
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(MODES))
def test_every_on_policy_mode_matches_reference(ray_local, models, tmp_path, tmp_path_factory, case):
    from digenrl.observe.trace import read_chrome_trace

    cfg = _cfg(models, "wan", tmp_path / "run", *MODES[case])
    _run(cfg, reference(models, "wan", tmp_path_factory))
    lanes = {f"sp{i}" for i in range(cfg.runtime.trainers // 2)}
    assert _rows(tmp_path / "run") == {"gen0"} | lanes
    if len(lanes) > 1:
        trained_on = {s.worker for s in read_chrome_trace(tmp_path / "run" / "trace.json") if s.kind == "train"}
        assert trained_on == lanes  # both lanes trained chunks of a step (TSP)


GEN_CASES = {  # sequence-parallel generators: gen0 is 2 actors gen0.0 and gen0.1 that denoise each fragment together
    "gap-objectstore": ["runtime.mode=gap", "runtime.generator_sequence_parallel=2"],  # 1 trainer rank
    "gap_tsp_tag-stream-both": ["runtime.mode=gap_tsp_tag", *SP2, "runtime.generator_sequence_parallel=2",
                                "runtime.publish=stream", "runtime.tag_policy=greedy",
                                "tuning.calibration_repeats=1", "runtime.trainer_resources={CPU: 0.75}",
                                "runtime.generator_resources={CPU: 0.75}"],
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(GEN_CASES))
def test_sequence_parallel_generators_match_reference(ray_local, models, tmp_path, tmp_path_factory, case):
    """A generator of 2 ranks (HunyuanVideo: DigenRL's plan) reports each trajectory once, and the run ends with
    the reference's parameters (the generator's samples are the unsplit model's)."""
    cfg = _cfg(models, "hunyuan_video", tmp_path / "run", *GEN_CASES[case])
    _run(cfg, reference(models, "hunyuan_video", tmp_path_factory))
    trainers = {"sp0"} if cfg.train.sequence_parallel.degree > 1 else {"trn0"}
    assert _rows(tmp_path / "run") == {"gen0"} | trainers  # the scheduler sees one generator
    traj = [json.loads(x) for x in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    assert len(traj) == cfg.steps * cfg.train.prompts_per_step * cfg.train.generations
    assert any(t["worker"] == "gen0" for t in traj)


@pytest.mark.slow
def test_lane_keeps_and_evaluates_the_ema(ray_local, models, tmp_path, tmp_path_factory):
    """With an EMA, rank 0's lane evaluates (its forwards are collectives of both ranks, so both hold the EMA) after
    every step and writes the EMA weights, which equal the reference's."""
    math = ("train.ema_decay=0.5",)
    cfg = _cfg(models, "wan", tmp_path / "run", "runtime.mode=gap_tsp", *SP2, "eval.every=1", *math)
    summary = _run(cfg, reference(models, "wan", tmp_path_factory, *math))
    # the final eval on the lane: the reference's EMA weights evaluated unsplit (a rank without the EMA would mix weights)
    assert summary["eval_reward_final"] == pytest.approx(_EVALS[("wan", *math)], abs=1e-5)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = {r["step"]: r["eval_reward"] for r in rows if "eval_reward" in r}
    assert {1, 2} <= set(evals) and all(0.0 <= v <= 1.0 for v in evals.values())  # mid-run side calls on the lane
