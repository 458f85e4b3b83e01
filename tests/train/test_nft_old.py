"""DiffusionNFT's soft-updated old policy (``train.nft_old_policy=soft``, ``train.nft_old``): the decay schedule
against the reference's ``return_decay`` written out here, the update after each step's last optimizer step,
the generators sampling with it, and exact resume from a checkpoint."""

from __future__ import annotations

import copy

import pytest
import torch

from digenrl.config import load_config

SMALL = ["train.prompts_per_step=2", "train.generations=4", "sampler.num_steps=6", "log.progress=false",
         "train.ema_decay=null", "train.algorithm=nft", "train.nft_timesteps=3", "train.lr=3e-3"]


def _reference_decay(step: int, decay_type: int) -> float:
    """NVlabs/DiffusionNFT@24af555 scripts/train_nft_sd3.py ``return_decay``: (flat, uprate, uphold) per type,
    0 before flat, then min((step - flat) uprate, uphold)."""
    flat, uprate, uphold = {0: (0, 0.0, 0.0), 1: (0, 0.001, 0.5), 2: (75, 0.0075, 0.999)}[decay_type]
    return 0.0 if step < flat else min((step - flat) * uprate, uphold)


def test_decay_schedule_is_the_references():
    from digenrl.train.nft_old import old_decay

    default = load_config(None, ["train.algorithm=nft"]).train.nft_old_decay
    assert tuple(default) == (0, 0.001, 0.5)  # decay_type 1, config/nft.py _get_config
    for n in (0, 1, 2, 7, 499, 500, 501, 10_000):
        assert old_decay(n, *default) == pytest.approx(_reference_decay(n, 1), abs=1e-15)
        assert old_decay(n, 0, 0.0, 0.0) == _reference_decay(n, 0)
    for n in (0, 74, 75, 76, 100, 208, 209, 300):
        assert old_decay(n, 75, 0.0075, 0.999) == pytest.approx(_reference_decay(n, 2), abs=1e-15)
    assert old_decay(1, *default) == pytest.approx(0.001) and old_decay(600, *default) == 0.5


def test_old_copy_moves_after_the_last_commit_of_a_step_only():
    from digenrl.train.nft_old import OldPolicy

    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    net.bias.requires_grad_(False)  # frozen tensors are not shadowed
    old = OldPolicy(net, (0, 0.1, 0.5))
    assert set(old.shadow) == {"weight"}
    w0 = net.weight.detach().clone()
    want = w0.clone()
    for step in range(3):  # two optimizer steps per step: n = 2, 4, 6 at the step's end -> d = 0.2, 0.4, 0.5
        for m in range(2):
            with torch.no_grad():
                net.weight.add_(torch.randn_like(net.weight))
            old.commit(final=m == 1)
        d = min(0.1 * 2 * (step + 1), 0.5)
        want = d * want + (1 - d) * net.weight.detach()
        torch.testing.assert_close(old.shadow["weight"], want, rtol=0, atol=1e-6)
    live = net.weight.detach().clone()
    with old.swapped():
        assert torch.equal(net.weight, old.shadow["weight"]) is False  # the shadow holds theta meanwhile
        torch.testing.assert_close(net.weight.detach(), want, rtol=0, atol=1e-6)
    assert torch.equal(net.weight.detach(), live)


def _ctx(tiny_policy, *overrides):
    from digenrl.train.context import build_context

    cfg = load_config(None, [*SMALL, *overrides])
    return cfg, build_context(cfg, policy=copy.deepcopy(tiny_policy))


def test_a_run_samples_with_the_old_copy_and_updates_it(tiny_policy):
    """Step 1 samples with old_1 = d_1 theta_0 + (1 - d_1) theta_1 (the reference's ``old`` adapter), built here
    from the weights the run had before and after step 0; M = 2 optimizer steps per step: d_1 = d(n = 2)."""
    from product import product_steps

    from digenrl.train.step_math import generate

    cfg = load_config(None, [*SMALL, "train.nft_old_decay=[0, 0.2, 0.5]", "train.minibatches_per_step=2"])
    theta0 = {k: v.detach().clone() for k, v in tiny_policy.state_dict().items()}
    ctx = product_steps(cfg, policy=copy.deepcopy(tiny_policy), steps=1)[0].ctx
    theta1 = {k: v.detach().clone() for k, v in ctx.policy.state_dict().items()}
    d = 0.4  # min(0.2 x 2, 0.5)
    holder = copy.deepcopy(ctx.policy)
    holder.__dict__["nft_old"] = None
    holder.load_state_dict({k: d * theta0[k] + (1 - d) * theta1[k] for k in theta0})
    prompts = ctx.task.train_prompts(1, 2, cfg.seed)
    rep = [p for p in prompts for _ in range(4)]
    gens = [g for _ in prompts for g in range(4)]
    kw = dict(step=1, run_seed=cfg.seed, version=1, settings=ctx.sampler, plan=ctx.plan(1), reward=ctx.reward)
    want = generate(holder, rep, gens, **kw).final
    from digenrl.train.nft_old import sampling_weights

    with sampling_weights(ctx.policy):
        got = generate(ctx.policy, rep, gens, **kw).final
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    live = generate(ctx.policy, rep, gens, **kw).final  # the test can fail: theta_1 samples otherwise
    assert float((live - want).abs().max()) > 1e-4


def test_resume_from_a_checkpoint_is_exact(tiny_policy):
    """4 steps straight == 2 steps, checkpoint bytes, a fresh context restored, 2 more (weights and old copy)."""
    from product import product_steps

    from digenrl.train.checkpoint import capture, pack, restore_train_state, unpack

    over = ["train.nft_old_decay=[0, 0.2, 0.5]"]
    cfg = load_config(None, [*SMALL, *over])
    straight = product_steps(cfg, policy=copy.deepcopy(tiny_policy), steps=4)[0].ctx
    first = product_steps(cfg, policy=copy.deepcopy(tiny_policy), steps=2)[0].ctx
    data = pack(capture(first, step=2))
    state = unpack(data)
    assert state.nft_old is not None and state.nft_old_commits == 2
    resumed = product_steps(cfg, policy=copy.deepcopy(tiny_policy), steps=2, state=data)[0].ctx  # restored, then on
    for k, v in straight.policy.state_dict().items():
        assert torch.equal(v, resumed.policy.state_dict()[k]), k
    for k, v in straight.policy.nft_old.shadow.items():
        assert torch.equal(v, resumed.policy.nft_old.shadow[k]), k
    assert resumed.policy.nft_old.commits == 4
    _, current = _ctx(tiny_policy, "train.nft_old_policy=current")  # a checkpoint without the copy is refused
    with pytest.raises(ValueError, match="old policy"):
        restore_train_state(resumed, unpack(pack(capture(current, step=0))))


def test_lora_shadows_the_adapters_only(tmp_path):
    """A tiny SD3 with LoRA: the old copy holds the adapters, moves by the schedule, and the frozen base is
    shared by both (one copy)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
    import tiny_diffusers as td

    from product import product_steps

    from digenrl.train.context import build_context

    model = td.save_sd3(tmp_path / "sd3")
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red cat\na big dog\n")
    td.random_cache(tmp_path / "cache", "sd3-test", ["a red cat", "a big dog", ""], td.SD3_COND)
    cfg = load_config(None, [
        "model.kind=sd3", f"model.path={model}", f"model.prompt_cache_dir={tmp_path}/cache",
        "model.options={height: 16, width: 16}", "model.lora.enabled=true", "model.lora.rank=2", "task.name=text",
        f"task.prompts_file={prompts}", "reward={jpeg_incompressibility: {weight: 1}}", "sampler.num_steps=3",
        "train.prompts_per_step=2", "train.generations=2", "train.chunk_generations=2", "log.progress=false",
        "train.lr=0.01", "train.algorithm=nft", "train.nft_old_decay=[0, 0.3, 0.5]", "train.ema_decay=null"])
    start = build_context(cfg).policy  # (seeded: the weights the run starts from)
    trainable = {n for n, p in start.named_parameters() if p.requires_grad}
    assert set(start.nft_old.shadow) == trainable and all("lora" in n for n in trainable)
    theta0 = {n: p.detach().clone() for n, p in start.named_parameters() if n in trainable}
    worker, (row,) = product_steps(cfg, steps=1)
    ctx = worker.ctx
    old = ctx.policy.nft_old
    assert row["approx_kl"] == 0.0
    d = 0.3  # n = 1
    for n, p in ctx.policy.named_parameters():
        if n in trainable:
            torch.testing.assert_close(old.shadow[n], d * theta0[n] + (1 - d) * p.detach(), rtol=0, atol=1e-6)
    assert any(not torch.equal(old.shadow[n], p) for n, p in ctx.policy.named_parameters() if n in trainable)
    assert product_steps(cfg, steps=1, first=1, worker=worker)[1][0]["approx_kl"] > 0  # v_old from the old adapters
