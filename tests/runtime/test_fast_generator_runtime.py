"""The generator pool's inference copy (``generator.*``, ``models.fast_generator``) in the generator worker.

The demo's pretrained base model (``models/tiny_dit.DEFAULT_BASE``) is used here, not the suite's random tiny model,
whose zero-initialised output layer makes every velocity 0 in any dtype (nothing to see in a mismatch).

* In-process (no Ray): the worker builds the copy the options ask for (bf16 weights, a compiled network), swaps a
  staged version in through it, and the test hook biases the recorded log-probs.
* A compiled float32 generator samples the eager trajectories (to float32 rounding), so a Ray run still ends with the
  reference's parameters (I1, ``tests/reference``), here with the broadcast publish (the compiled weights are swapped in place
  at every version).
* A bfloat16 generator with the stream publish receives the trainers' float32 tensors (``FastGenerator.layout``),
  and the mismatch metrics see its numerics.
"""

from __future__ import annotations

import json

import torch

from runtime_helpers import make_cfg, reference_run, run_matches

from digenrl.models.tiny_dit import DEFAULT_BASE
from digenrl.schedule import Fragment


def _rows(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if "reward_mean" in x]


def test_generator_worker_builds_the_copy(tmp_path, monkeypatch):
    from torch._dynamo.testing import CompileCounter

    from digenrl.control.run_plan import TestHooks
    from digenrl.runtime.generator import GeneratorWorker

    plain = GeneratorWorker("gen0", make_cfg(DEFAULT_BASE, tmp_path, "runtime.mode=gap").model_dump(mode="json"))
    conf = make_cfg(DEFAULT_BASE, tmp_path, "runtime.mode=gap", "generator.dtype=bfloat16").model_dump(mode="json")
    gen = GeneratorWorker("gen1", conf, TestHooks(logprob_offset=0.25))
    assert all(p.dtype == torch.bfloat16 for p in gen.policy.velocity_model().parameters())
    assert not gen.fast.compiled and not plain.fast.compiled
    state = {k: v + 0.01 for k, v in plain.policy.trainable_state_dict().items()}  # a published float32 version
    for w in (plain, gen):
        w.inbox.put(1, state)
    a, _ = plain.generate(Fragment(0, 0, (0, 1)), 1)  # swapped in from the inbox at the fragment's start
    b, _ = gen.generate(Fragment(0, 0, (0, 1)), 1)
    assert plain.version == gen.version == 1
    torch.testing.assert_close(dict(gen.policy.trainable_state_dict())["net.pos"].float(),
                               state["net.pos"].to(torch.bfloat16).float())
    torch.testing.assert_close(b.log_probs - 0.25, a.log_probs, rtol=0, atol=1e-5)  # the hook's bias, nothing else
    assert 1e-5 < float((b.final - a.final).abs().max()) < 0.1  # bf16 sampling: close, not equal

    counter = CompileCounter()
    conf = make_cfg(DEFAULT_BASE, tmp_path, "runtime.mode=gap", "generator.compile=default").model_dump(mode="json")
    from digenrl.models import fast_generator

    real = fast_generator.FastGenerator  # the worker's copy, with a counting backend in place of inductor
    monkeypatch.setattr(fast_generator, "FastGenerator", lambda policy, options: real(policy, options, backend=counter))
    compiled = GeneratorWorker("gen2", conf)
    assert compiled.fast.compiled and compiled.cfg.generator.compile == "default"
    for v in (1, 2, 3):
        compiled.inbox.put(v, {k: t + 0.01 * v for k, t in state.items()})
        compiled.generate(Fragment(0, 0, (0, 1)), v)
    assert counter.frame_count == 1  # compiled once, three versions swapped in


def test_compiled_generator_keeps_i1(ray_local, tmp_path):
    overrides = ["runtime.mode=gap_tsp_tag", "runtime.publish=broadcast", "generator.compile=default"]
    ref, _ = reference_run(DEFAULT_BASE, tmp_path / "ref", [])
    # compiled float32 reorders float32 operations (trajectories within ~1e-6 relative); a policy-gradient step
    # carries that into the weights, hence 5e-5 as the invariance tests allow for float noise (RTOL_MINIBATCHES)
    run_matches(make_cfg(DEFAULT_BASE, tmp_path / "run", *overrides), ref, 5e-5, 5e-5, "compiled generator")
    rows = _rows(tmp_path / "run")
    assert all(r["mismatch/cells"] > 0 and r["mismatch/max_abs_logp"] < 1e-4 for r in rows)


def test_bf16_generator_with_stream_publish(ray_local, tmp_path):
    from digenrl.runtime.driver import run_training

    overrides = ["runtime.mode=gap_tsp", "runtime.publish=stream", "generator.dtype=bfloat16",
                 "train.old_logprob=recompute", "train.tis_cap=2"]
    cfg = make_cfg(DEFAULT_BASE, tmp_path / "run", *overrides)
    summary = run_training(cfg, ray=True)
    assert summary["audit_violations"] == [] and summary["version"] == cfg.steps
    rows = _rows(tmp_path / "run")
    assert len(rows) == cfg.steps
    # bf16 velocities (~1e-2 relative) move the trainer's log-prob of the generator's transitions: seen, not zero
    assert all(r["mismatch/cells"] > 0 and 1e-4 < r["mismatch/max_abs_logp"] < 0.1 for r in rows), rows


def test_recompute_on_a_sharded_pool(ray_local, tiny_model, tmp_path, monkeypatch):
    """``train.old_logprob=recompute`` on a 2-rank FSDP shard group, 2 minibatches x 2 inner epochs: the later rounds'
    logp_start comes from the step-start snapshot of each rank's shards (swapped in with FSDP's reshard around it),
    so a generator pool biased by +0.5 still ends with the unbiased reference's parameters."""
    math = ["train.old_logprob=recompute", "train.minibatches_per_step=2", "train.inner_epochs=2"]
    ref, _ = reference_run(tiny_model, tmp_path / "ref", math)
    cfg = make_cfg(tiny_model, tmp_path / "run", "runtime.mode=gap_tsp", "runtime.trainers=2", "train.sharding=fsdp",
                   *math)
    monkeypatch.setenv("DIGENRL_TEST_HOOKS", "logprob_offset=0.5")
    run_matches(cfg, ref, 5e-5, 5e-5, "recompute, sharded")
    rows = _rows(tmp_path / "run")
    assert all(abs(r["mismatch/max_abs_logp"] - 0.5) < 1e-3 for r in rows)


def test_recompute_takes_stale_samples_at_the_step_start(ray_local, tiny_model, tmp_path):
    """TCSS with ``recompute``: a stale sample's logp_old is the trainers' log-prob under the step's starting weights,
    not its behaviour version's, so every first-round ratio is exactly 1 (approx_kl 0) where the generator's
    log-probs give stale samples a ratio (``test_tcss_failure``); the mismatch leaves the stale samples out."""
    from digenrl.runtime.driver import run_training

    run = tmp_path / "run"
    cfg = make_cfg(tiny_model, run, "runtime.mode=full", "steps=4", "runtime.max_stale_fraction=0.5",
                   "train.lr=3e-4", "train.old_logprob=recompute", "train.tis_cap=1.5")
    summary = run_training(cfg, ray=True)
    assert summary["audit_violations"] == [] and summary["version"] == cfg.steps
    rows = _rows(run)
    assert sum(r["staleness/1"] for r in rows) > 0, "TCSS never ran: the test would prove nothing"
    S = 2  # int(4 x 0.5) trained steps
    for r in rows:
        assert r["approx_kl"] == 0.0
        assert r["mismatch/cells"] <= (8 - r["staleness/1"]) * S
