"""``train.sharding=fsdp`` under the Ray runtime: a sharded trainer pool is one shard group whose actions are
collectives of its ranks (DESIGN.md 2.3), and the run still ends with the reference's parameters.

Oracle: ``tests/reference`` (one process, unsharded, written from the formulas; same config and seed). Compared per tensor
(1e-5 relative) without the attention key bias, whose exact gradient is 0 (softmax ignores it), so Adam turns
the rounding noise it gets into lr-sized steps of random sign in any two runs that round differently; the
whole state, key bias included, is compared through the global relative error (1e-5).
"""

from __future__ import annotations

import json

import pytest
import torch

from runtime_helpers import make_cfg

RTOL = 1e-5
SHARDED = ["runtime.trainers=2", "train.sharding=fsdp"]


def _profile(path):
    """A cost profile in which generators are slow and the trainers fast, so that BTS inserts TAG."""
    ops = {"generator/denoise": [[1, 0.5]], "trainer/denoise": [[1, 0.01]], "vae_decode": [[1, 0.001]],
           "reward": [[1, 0.001]], "transfer": [[1, 0.001]], "train_chunk": [[1, 0.01]], "allreduce": [[1, 0.0]],
           "optimizer": [[1, 0.001]], "publish": [[1, 0.001]], "tag_switch": [[1, 0.0]]}
    path.write_text(json.dumps({"format": "digenrl-profile", "version": 1, "ops": ops}))
    return path


@pytest.fixture(scope="module")
def reference(tiny_model, tmp_path_factory):
    from reference import reference_run

    return reference_run(make_cfg(tiny_model, tmp_path_factory.mktemp("ref")))[0]


def _comparable(name: str, t: torch.Tensor) -> torch.Tensor:
    if name.endswith("in_proj_bias"):
        d = t.shape[0] // 3
        return torch.cat([t[:d], t[2 * d:]])
    return t


def _errors(got: dict, ref: dict) -> tuple[float, float]:
    assert set(got) == set(ref)
    per = max(float((_comparable(k, got[k]) - _comparable(k, ref[k])).norm()
                    / _comparable(k, ref[k]).norm().clamp_min(1e-12)) for k in ref)
    glob = (sum(float((got[k] - ref[k]).square().sum()) for k in ref)
            / sum(float(ref[k].square().sum()) for k in ref)) ** 0.5
    return per, glob


def _check_params(run_dir, reference, tiny_model):
    from safetensors.torch import load_file

    per, glob = _errors(load_file(str(run_dir / "checkpoint.safetensors")), reference)
    assert per <= RTOL and glob <= RTOL, (per, glob)
    init = load_file(str(tiny_model))
    assert _errors(init, reference)[0] > 100 * RTOL  # the run really moved the weights


@pytest.mark.slow
@pytest.mark.parametrize("copy", [False, True], ids=["gathers", "inference_copy"])
def test_sharded_pipelined_with_tag_matches_reference(ray_local, tiny_model, tmp_path, reference, copy):
    """TAG on the shard group, its ranks gathering the shards at every forward or generating from an inference
    copy gathered once per version (tuning.tag_inference_copy)."""
    from digenrl.runtime.driver import run_training

    run = tmp_path / "run"
    cfg = make_cfg(tiny_model, run, "runtime.mode=gap_tsp_tag", *SHARDED, "runtime.fragment_size=1",
                   f"runtime.profile={_profile(tmp_path / 'profile.json')}", f"tuning.tag_inference_copy={copy}")
    summary = run_training(cfg, ray=True)
    assert summary["audit_violations"] == [] and summary["version"] == cfg.steps
    _check_params(run, reference, tiny_model)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert sum(r.get("tag_fragments", 0) for r in rows) > 0  # the shard group generated (TAG, collectively)
    traj = [json.loads(x) for x in (run / "trajectories.jsonl").read_text().splitlines()]
    assert any(t["worker"] == "shard0" and t["tag"] for t in traj)
    assert len(traj) == cfg.steps * cfg.train.prompts_per_step * cfg.train.generations  # each generation once
    trace = json.loads((run / "trace.json").read_text())
    rows_named = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert rows_named == {"gen0", "shard0"}  # the scheduler sees one trainer: the shard group
    # gang TAG: the group's 2 ranks took two 1-generation fragments of a group in one action (x2) and split it
    from digenrl.observe.trace import read_chrome_trace

    tags = [s for s in read_chrome_trace(run / "trace.json") if s.kind == "tag"]
    assert any(" x2 " in f" {s.label} " for s in tags), [s.label for s in tags]


@pytest.mark.slow
@pytest.mark.parametrize("copy", [False, True], ids=["gathers", "inference_copy"])
def test_sharded_gang_over_two_groups_matches_reference(ray_local, tiny_model, tmp_path, reference, copy):
    """Greedy TAG on the shard group of 2 ranks, groups of 4 generations cut into fragments of 3 and 1: the
    generator takes (0, 1, 2) of group 0, the group's gang the next two fragments wherever they lie: (3,) of
    group 0 and (0, 1, 2) of group 1, one action over two groups (``Generate.more``); the ranks split the 4
    generations round-robin (two each, of both groups, in one batch) and the trajectories reach the right
    groups' training."""
    from digenrl.observe.trace import read_chrome_trace
    from digenrl.runtime.driver import run_training

    run = tmp_path / "run"
    cfg = make_cfg(tiny_model, run, "runtime.mode=gap_tsp_tag", *SHARDED, "runtime.fragment_size=3",
                   "runtime.tag_policy=greedy", f"runtime.profile={_profile(tmp_path / 'profile.json')}",
                   f"tuning.tag_inference_copy={copy}")
    summary = run_training(cfg, ray=True)
    assert summary["audit_violations"] == [] and summary["version"] == cfg.steps
    _check_params(run, reference, tiny_model)
    tags = [s for s in read_chrome_trace(run / "trace.json") if s.kind == "tag"]
    assert any(" g0-1 x4 " in f" {s.label} " for s in tags), [s.label for s in tags]
    traj = [json.loads(x) for x in (run / "trajectories.jsonl").read_text().splitlines()]
    assert len(traj) == cfg.steps * cfg.train.prompts_per_step * cfg.train.generations  # each generation once
    assert len({(t["step"], t["uid"], t["generation"]) for t in traj}) == len(traj)


@pytest.mark.slow
def test_sharded_colocated_matches_reference(ray_local, tiny_model, tmp_path, reference):
    from digenrl.runtime.driver import run_training

    # fragments of 1 generation: one of the 2 ranks has no share of each and only joins the forwards
    # ... and the shard group times its ops before step 1 (every forward a collective, sizes round-robin)
    cfg = make_cfg(tiny_model, tmp_path / "run", "runtime.mode=colocated", *SHARDED, "runtime.fragment_size=1",
                   "runtime.calibration.when=always", "tuning.calibration_repeats=1")
    summary = run_training(cfg, ray=True)
    assert summary["audit_violations"] == [] and summary["version"] == cfg.steps
    _check_params(tmp_path / "run", reference, tiny_model)
    prof = json.loads((tmp_path / "run" / "profile.json").read_text())
    assert prof["trainers"] == 2 and prof["ops"]["train_chunk"][0][1] > 0


@pytest.mark.slow
def test_sharded_checkpoints_resume_to_the_reference(ray_local, tiny_model, tmp_path, reference):
    """Every rank writes its shards (torch.distributed.checkpoint) next to the metadata file; a run stopped
    after 2 steps and resumed for the third ends with the uninterrupted run's parameters (weights published by
    a torch.distributed broadcast from the sharded pool)."""
    from digenrl.runtime.run_dir import run_start
    from digenrl.runtime.driver import run_training
    from digenrl.train import checkpoint as ckpt

    run = tmp_path / "run"
    over = ["runtime.mode=gap_tsp", *SHARDED, "runtime.checkpoint_every=1", "runtime.keep_checkpoints=1",
            "runtime.publish=broadcast"]  # the ranks gather the full state, rank 0 broadcasts it
    run_training(make_cfg(tiny_model, run, *over, "steps=2"), ray=True)
    found = ckpt.list_checkpoints(run)
    assert [k for k, _ in found] == [2]  # keep_checkpoints=1 removed step 1's file ...
    d = ckpt.checkpoint_dir(run)
    assert sorted(p.name for p in d.iterdir() if p.is_dir()) == ["step_00000002.dcp"]  # ... and its shards
    state = ckpt.read_train_state(found[-1][1])
    assert state.sharded == "step_00000002.dcp" and state.model == {} and state.version == 2
    assert ".metadata" in state.shards and ckpt.verify_checkpoint(found[-1][1]) is None  # every shard file hashed
    cfg = make_cfg(tiny_model, run, *over, "steps=3")
    summary = run_training(cfg, run_start(cfg, resume=True), ray=True)
    assert summary["version"] == 3
    _check_params(run, reference, tiny_model)


@pytest.mark.slow
def test_sharded_lora_diffusers_matches_reference(ray_local, tmp_path):
    """LoRA on a tiny FLUX (diffusers) over a 2-rank shard group, pipelined: the adapters only are trained,
    published and checkpointed (gathered from the shards); they end within 1e-5 of the reference."""
    import sys
    from pathlib import Path

    from safetensors.torch import load_file

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
    from tiny_diffusers import save_flux

    from digenrl.config import load_config
    from reference import Reference

    from digenrl.runtime.driver import run_training

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cat\na big dog\n")
    common = ["model.kind=flux", f"model.path={save_flux(tmp_path / 'flux')}", "model.lora.enabled=true",
              "model.lora.rank=4", "model.lora.alpha=8", "model.options={height: 16, width: 16, max_sequence_length: 8}",
              "task.name=text", f"task.prompts_file={prompts}", "reward={jpeg_incompressibility: {weight: 1.0}}",
              "steps=2", "train.prompts_per_step=2", "train.generations=2", "sampler.num_steps=4",
              "train.timestep_fraction=0.5", "train.lr=3e-3", "train.ema_decay=null", "train.chunk_generations=2",
              "train.chunk_timesteps=2", "runtime.fragment_size=2", "eval.num_prompts=2", "eval.grid_prompts=2",
              "eval.every=0", "log.progress=false"]
    ref_cfg = load_config(None, [f"run_dir={tmp_path}/ref", *common])
    oracle = Reference(ref_cfg)
    init = {k: v.detach().clone() for k, v in oracle.policy.trainable_state_dict().items()}
    for k in range(ref_cfg.steps):
        oracle.step(k)
    ref = {k: v.detach().clone() for k, v in oracle.policy.trainable_state_dict().items()}
    cfg = load_config(None, [f"run_dir={tmp_path}/run", *common, "runtime.mode=gap_tsp", *SHARDED])
    summary = run_training(cfg, ray=True)
    assert summary["audit_violations"] == [] and summary["version"] == cfg.steps
    got = load_file(str(tmp_path / "run" / "checkpoint.safetensors"))
    assert set(got) == set(ref) and all("lora" in k for k in got)  # adapters only
    per, glob = _errors(got, ref)
    assert per <= RTOL and glob <= RTOL, (per, glob)
    assert _errors(init, ref)[0] > 100 * RTOL


HYBRID = ["runtime.trainers=4", "train.sharding=fsdp", "train.shard_groups=2",
          "runtime.trainer_resources={CPU: 0.75}"]  # 2 shard groups x 2 ranks (+ a generator on 4 CPUs)


@pytest.mark.slow
def test_hybrid_sharding_with_gang_tag_matches_reference(ray_local, tiny_model, tmp_path, reference):
    """Hybrid sharding: 4 ranks as 2 shard groups of 2 (each a data-parallel replica of the other). The
    scheduler sees two trainers, TSP spreads the chunks over them, TAG gangs run on either group, and the commit
    sums the gradient shards across the groups; the run ends with the reference's parameters."""
    from digenrl.observe.trace import read_chrome_trace
    from digenrl.runtime.driver import run_training

    run = tmp_path / "run"
    cfg = make_cfg(tiny_model, run, "runtime.mode=gap_tsp_tag", *HYBRID, "runtime.fragment_size=1",
                   f"runtime.profile={_profile(tmp_path / 'profile.json')}")
    summary = run_training(cfg, ray=True)
    assert summary["audit_violations"] == [] and summary["version"] == cfg.steps
    _check_params(run, reference, tiny_model)
    trace = json.loads((run / "trace.json").read_text())
    rows_named = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert rows_named == {"gen0", "shard0", "shard1"}  # the scheduler's trainers: one per shard group
    spans = read_chrome_trace(run / "trace.json")
    trained_on = {s.worker for s in spans if s.kind == "train"}
    assert trained_on == {"shard0", "shard1"}  # both groups trained chunks of the same step (TSP)
    assert any(s.kind == "tag" and " x2 " in f" {s.label} " for s in spans)  # a gang of 2 fragments on a group
    traj = [json.loads(x) for x in (run / "trajectories.jsonl").read_text().splitlines()]
    assert len(traj) == cfg.steps * cfg.train.prompts_per_step * cfg.train.generations  # each generation once


@pytest.mark.slow
def test_hybrid_sharding_broadcast_publish_and_resume(ray_local, tiny_model, tmp_path, reference):
    """Hybrid sharding with the broadcast publish (the generator joins the world and creates the shard and
    replica groups too) and a resume: rank 0's group writes the shards, every group loads them back."""
    from digenrl.runtime.run_dir import run_start
    from digenrl.runtime.driver import run_training
    from digenrl.train import checkpoint as ckpt

    run = tmp_path / "run"
    over = ["runtime.mode=gap_tsp", *HYBRID, "runtime.checkpoint_every=1", "runtime.keep_checkpoints=1",
            "runtime.publish=broadcast"]
    run_training(make_cfg(tiny_model, run, *over, "steps=2"), ray=True)
    state = ckpt.read_train_state(ckpt.list_checkpoints(run)[-1][1])
    assert state.sharded == "step_00000002.dcp" and sorted(state.shards) == [".metadata", "__0_0.distcp",
                                                                             "__1_0.distcp"]  # one group's 2 ranks
    cfg = make_cfg(tiny_model, run, *over, "steps=3")
    summary = run_training(cfg, run_start(cfg, resume=True), ray=True)
    assert summary["version"] == 3 and summary["audit_violations"] == []
    _check_params(run, reference, tiny_model)


def _check_stream_spans(spans, clock_error_s: float) -> None:
    """A streamed publish holds the generator until it holds the version, and the senders (the shard group's row)
    only while they start their sends: each sender span lies inside its version's generator span. (The generator's
    span is the driver's launch to completion, a sender's the ranks' own stamps on the driver's clock,
    ``runtime.clocks``: to within twice the run's clock error bound, a rank of the row each.)"""
    pubs = [s for s in spans if s.kind == "publish"]
    gen = {s.label: s for s in pubs if s.worker == "gen0"}
    senders = [s for s in pubs if s.worker != "gen0"]
    assert gen and senders and {s.label for s in senders} == set(gen)
    tol = 2.0 * clock_error_s + 2e-6
    for s in senders:
        g = gen[s.label]
        assert s.worker.startswith("shard") and g.start - tol <= s.start <= s.end <= g.end + tol, (s, g, tol)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["3ranks", "hybrid2x2"])
def test_stream_publish_from_every_shard_matches_reference(ray_local, tiny_model, tmp_path, reference, layout):
    """``runtime.publish=stream``: no gather; each rank of the (first) shard group streams its own shards and the
    generator joins them: over 3 ranks the tiny DiT's 32-row tensors split 11 + 11 + 10 and its shorter ones
    leave a rank empty (FSDP2's torch.chunk split), under hybrid sharding the first group's 2 ranks send. The
    generator samples with what it joined, so a wrong part would change the run's parameters."""
    from digenrl.observe.trace import read_chrome_trace
    from digenrl.runtime.driver import run_training

    pool = ["runtime.trainers=3", "train.sharding=fsdp"] if layout == "3ranks" else HYBRID
    run = tmp_path / "run"
    cfg = make_cfg(tiny_model, run, "runtime.mode=gap_tsp", *pool, "runtime.publish=stream")
    summary = run_training(cfg, ray=True)
    assert summary["audit_violations"] == [] and summary["version"] == cfg.steps
    _check_params(run, reference, tiny_model)
    _check_stream_spans(read_chrome_trace(run / "trace.json"), summary["clock_error_s"])


@pytest.mark.slow
def test_stream_publish_in_full_mode_on_a_shard_group(ray_local, tiny_model, tmp_path):
    """``full`` with a stream from a 2-rank shard group: the ranks' asynchronous sends drain while the group
    trains the next step's stale groups (FSDP collectives of their own group beside the stream groups); the
    audit of the run (no commit before its version is out, the publish holding the generator only) is clean.
    (Whether a chunk overlaps a publish depends on the machine's timing; the scheduler test asserts it.)"""
    from digenrl.observe.trace import read_chrome_trace
    from digenrl.runtime.driver import run_training

    run = tmp_path / "run"
    cfg = make_cfg(tiny_model, run, "runtime.mode=full", "steps=4", "runtime.max_stale_fraction=0.5", *SHARDED,
                   "runtime.publish=stream")
    summary = run_training(cfg, ray=True)
    assert summary["audit_violations"] == [] and summary["version"] == cfg.steps
    _check_stream_spans(read_chrome_trace(run / "trace.json"), summary["clock_error_s"])
    traj = [json.loads(x) for x in (run / "trajectories.jsonl").read_text().splitlines()]
    assert all(t["version"] in (t["step"] - 1, t["step"] - 2) for t in traj) and len(traj) == cfg.steps * 8
