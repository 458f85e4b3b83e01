"""A trainer rank samples (its evals, a packed colocated worker's share of the step, TAG gangs) in batches that
fit beside its training state (``train.memory_check.trainer_generation_batch``): the bound's rule, its refusal,
the worker sampling and evaluating in those batches with the same results, and the calibration timing the
batches the run samples."""

from __future__ import annotations

import pytest
import torch

from digenrl.config import load_config
from digenrl.train.memory import GiB, MemoryPlanError, generator_bytes, plan_memory
from digenrl.train.memory_check import SAMPLE_BATCH, inputs_from_config, trainer_generation_batch

WAN = "configs/wan21_14b.yaml"


def _terms(cfg, forwards: int):
    """(what the rank holds while it samples, one generation's sampling activations) in bytes, from the plan's
    items: all but autocast's copies, and in colocated (after the commit) but the gradients and their sums."""
    p = inputs_from_config(cfg)
    items = plan_memory(p).items
    free = {"cast"} | ({"grads", "grad_sums"} if cfg.runtime.mode == "colocated" else set())
    held = sum(v for k, v in items.items() if k not in free)
    return held, generator_bytes(p.__class__(**{**p.__dict__, "forwards_per_cell": forwards}), 1)["activations"]


@pytest.mark.parametrize("over,forwards", [(["runtime.mode=colocated", "runtime.generators=1"], 2),  # wan: CFG, two forwards a sample
                                           (["runtime.mode=gap_tsp_tag", "sampler.cfg_scale=1.0",
                                            "sampler.eval_cfg_scale=1.0"], 1)])
def test_the_bound_is_the_most_generations_that_fit_beside_the_state(over, forwards):
    cfg = load_config(WAN, [*over, "train.memory_gb=44"])
    state, per = _terms(cfg, forwards)
    n = trainer_generation_batch(cfg)
    assert 1 <= n < SAMPLE_BATCH  # the case binds: below the default batch
    assert state + n * per <= 44 * GiB < state + (n + 1) * per
    colocated = load_config(WAN, ["runtime.mode=colocated", "runtime.generators=1", "train.memory_gb=44"])
    share = -(-cfg.train.prompts_per_step * cfg.train.generations // cfg.runtime.trainers)
    assert trainer_generation_batch(colocated) < share  # the packed share (one action) is sampled in several batches


def test_trainers_that_only_evaluate_are_bounded_between_steps():
    """gap_tsp: the trainers sample only their evals, between steps (no gradients held), as colocated's share."""
    gap_tsp = trainer_generation_batch(load_config(WAN, ["runtime.mode=gap_tsp", "train.memory_gb=44"]))
    colocated = trainer_generation_batch(load_config(WAN, ["runtime.mode=colocated", "train.memory_gb=44"]))
    tag = trainer_generation_batch(load_config(WAN, ["runtime.mode=gap_tsp_tag", "train.memory_gb=44"]))
    assert gap_tsp == colocated and tag < gap_tsp  # a TAG gang runs beside the step's gradients
    # the eval's own guidance counts: wan sampled without CFG but evaluated with it: two forwards a sample
    off = ["runtime.mode=gap_tsp", "train.memory_gb=44", "sampler.cfg_scale=1.0", "sampler.eval_cfg_scale=1.0"]
    assert trainer_generation_batch(load_config(WAN, [*off, "sampler.eval_cfg_scale=5.0"])) < \
        trainer_generation_batch(load_config(WAN, off))


def test_no_bound_where_nothing_is_planned():
    assert trainer_generation_batch(load_config(WAN, ["runtime.mode=colocated", "train.memory_gb=null"])) is None
    assert trainer_generation_batch(load_config(None, ["train.memory_gb=80"])) is None  # the tiny DiT: no plan
    assert trainer_generation_batch(load_config(WAN, ["runtime.mode=colocated", "train.memory_gb=1000"])) == SAMPLE_BATCH


def test_a_rank_with_no_room_for_one_generation_is_refused_by_name(capsys):
    cfg = load_config(WAN, ["runtime.mode=gap_tsp_tag"])
    state, per = _terms(cfg, 2)
    cap = (state + per / 2) / GiB
    with pytest.raises(MemoryPlanError, match="train.memory_gb") as e:
        trainer_generation_batch(load_config(WAN, ["runtime.mode=gap_tsp_tag", f"train.memory_gb={cap}"]))
    assert "runtime.mode without TAG" in str(e.value) and "per sample" in str(e.value)


def _spy_batches(monkeypatch):
    import digenrl.rollout.sampler as sampler
    import digenrl.train.step_math as step_math

    sizes, real = [], sampler.sample_trajectories

    def spy(policy, prompts, *a, **kw):
        sizes.append(len(prompts))
        return real(policy, prompts, *a, **kw)

    monkeypatch.setattr(step_math, "sample_trajectories", spy)
    monkeypatch.setattr(sampler, "sample_trajectories", spy)
    return sizes


def test_a_colocated_worker_samples_its_share_in_bounded_batches_with_the_same_results(monkeypatch):
    """One worker's share is the step's 2 x 4 generations (one action); bounded to 3 it samples 3 + 3 + 2, and
    the step ends with the weights of the unbounded run (each sample's noise is its own)."""
    from product import product_steps

    import digenrl.runtime.trainer as trainer

    cfg = load_config(None, ["train.prompts_per_step=2", "train.generations=4", "sampler.num_steps=4",
                             "log.progress=false", "train.ema_decay=null"])
    free, _ = product_steps(cfg, steps=1)
    sizes = _spy_batches(monkeypatch)
    monkeypatch.setattr(trainer, "trainer_generation_batch", lambda cfg: 3)
    bounded, _ = product_steps(cfg, steps=1)
    assert sizes == [3, 3, 2], sizes
    for (name, a), b in zip(free.policy.named_parameters(), bounded.policy.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_sampler_batch_size_caps_the_batches_and_the_memory_bound_still_binds(monkeypatch):
    """``sampler.batch_size`` (Flow-GRPO's per-GPU ``sample.train_batch_size``): a colocated worker's share of
    2 x 4 is sampled 3 + 3 + 2; under a memory bound of 2 the bound wins; a generator is capped too."""
    from product import product_steps

    import digenrl.runtime.trainer as trainer
    from digenrl.runtime.generator import GeneratorWorker

    cfg = load_config(None, ["train.prompts_per_step=2", "train.generations=4", "sampler.num_steps=2",
                             "log.progress=false", "train.ema_decay=null", "sampler.batch_size=3"])
    sizes = _spy_batches(monkeypatch)
    product_steps(cfg, steps=1)
    assert sizes == [3, 3, 2], sizes
    sizes.clear()
    monkeypatch.setattr(trainer, "trainer_generation_batch", lambda cfg: 2)
    product_steps(cfg, steps=1)
    assert sizes == [2, 2, 2, 2], sizes
    gen = load_config(None, ["runtime.mode=gap_tsp", "sampler.batch_size=3", "log.progress=false"])
    assert GeneratorWorker("gen0", gen.model_dump(mode="json")).gen_batch == 3


def test_a_trainer_evaluates_in_bounded_batches_with_the_same_reward(monkeypatch):
    from product import product_worker

    cfg = load_config(None, ["sampler.num_steps=2", "eval.num_prompts=5", "log.progress=false"])
    worker = product_worker(cfg)
    free = worker.evaluate(2).value
    sizes = _spy_batches(monkeypatch)
    worker.gen_batch = 2
    bounded = worker.evaluate(2).value
    assert sizes == [2, 2, 1], sizes
    assert bounded[0] == pytest.approx(free[0], rel=1e-5)


def test_the_calibration_times_the_batches_the_worker_samples(monkeypatch):
    from product import product_worker

    from digenrl.runtime.timing import generation_ops

    cfg = load_config(None, ["sampler.num_steps=2", "log.progress=false"])
    worker = product_worker(cfg)
    worker.gen_batch = 2
    sizes = _spy_batches(monkeypatch)
    ops = generation_ops(worker, worker.policy, [5])
    for phase in ("sample", "decode", "reward", "transfer"):
        ops[("generate", 5, phase)]()
    assert sizes == [2, 2, 1], sizes


def test_check_prints_the_bound(capsys):
    from digenrl.cli import main

    over = ["runtime.mode=colocated", "runtime.generators=1", "train.memory_gb=44"]
    n = trainer_generation_batch(load_config(WAN, over))
    assert main(["check", "-c", WAN, "--config-only", "-q", *over]) == 0
    assert f"(evals, its share of each step): at most {n} samples per batch" in capsys.readouterr().out


def test_eval_and_sample_are_bounded_by_a_generators_items():
    """``digenrl eval`` / ``sample`` hold the policy and no training state: the largest n with the generator's
    items (weights, VAE, text encoders, reserve) + n samples' activations within train.memory_gb, more than a
    trainer rank fits beside its state."""
    from digenrl.train.memory_check import sampling_batch

    cfg = load_config(WAN, ["train.memory_gb=40"])
    p = inputs_from_config(cfg)
    q = p.__class__(**{**p.__dict__, "forwards_per_cell": 2, "sequence_parallel": 1})  # wan evaluates with CFG
    fixed = sum(v for k, v in generator_bytes(q, 0).items() if k != "activations")
    per = generator_bytes(q, 1)["activations"]
    n = sampling_batch(cfg)
    assert 1 <= n < SAMPLE_BATCH
    assert fixed + n * per <= 40 * GiB < fixed + (n + 1) * per
    assert n > trainer_generation_batch(load_config(WAN, ["runtime.mode=gap_tsp", "train.memory_gb=40"]))
    assert sampling_batch(load_config(None, ["train.memory_gb=40"])) is None  # the tiny DiT: no plan


def test_eval_refuses_a_memory_that_holds_no_sample_before_loading(capsys):
    from digenrl.cli import main

    assert main(["eval", "-c", WAN, "train.memory_gb=20", "model.path=/nonexistent"]) == 2
    err = capsys.readouterr().err
    assert "one sample" in err and "train.memory_gb=20" in err and "/nonexistent" not in err, err


def test_eval_cli_samples_in_its_bound(monkeypatch, capsys):
    import json

    import digenrl.train.memory_check as memory_check
    from digenrl.cli import main

    monkeypatch.setattr(memory_check, "sampling_batch", lambda cfg: 2)
    sizes = _spy_batches(monkeypatch)
    assert main(["eval", "sampler.num_steps=2", "eval.num_prompts=5", "log.progress=false"]) == 0
    assert sizes == [2, 2, 1], sizes
    assert 0.0 <= json.loads(capsys.readouterr().out.strip().splitlines()[-1])["eval_reward"] <= 1.0
