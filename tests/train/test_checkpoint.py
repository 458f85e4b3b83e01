"""Resumable checkpoints: what they hold (LoRA: adapters + optimizer only), atomic files and pruning,
damaged files skipped, and which config changes a resume refuses (the ones that change a step's math)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from digenrl.config import ConfigError, load_config
from digenrl.train import checkpoint as ckpt
from digenrl.train.resume_config import check_resume_config, config_hash

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import tiny_diffusers as td  # noqa: E402


def test_math_keys_are_refused_free_keys_allowed():
    base = load_config(None, [])
    saved = base.model_dump(mode="json")
    for ok in ["steps=500", "run_dir=elsewhere", "eval.every=3", "log.progress=false", "runtime.mode=gap_tsp",
               "runtime.generators=3", "runtime.checkpoint_every=7", "model.device=cuda:1", "train.chunk_timesteps=1"]:
        check_resume_config(saved, load_config(None, [ok]))
    older = {k: v for k, v in saved.items() if k != "resume"}    # written before a key existed: its default
    older["train"] = {k: v for k, v in saved["train"].items() if k != "ema_decay"}
    check_resume_config(older, base)
    for bad, key in [("train.lr=0.1", "train.lr"), ("seed=3", "seed"), ("sampler.noise_level=0.5", "sampler.noise_level"),
                     ("runtime.mode=full", "runtime.mode"), ("reward={digits: {weight: 2}}", "reward.digits.weight"),
                     ("train.generations=4", "train.generations"), ("model.path=x.safetensors", "model.path")]:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            check_resume_config(saved, load_config(None, [bad]))


def test_a_sharded_checkpoint_resumes_only_on_as_many_ranks():
    sharded = ["train.sharding=fsdp", "runtime.mode=gap_tsp", "runtime.trainers=2"]
    saved = load_config(None, sharded).model_dump(mode="json")
    check_resume_config(saved, load_config(None, sharded))
    with pytest.raises(ConfigError, match=r"runtime\.trainers=2"):
        check_resume_config(saved, load_config(None, [*sharded, "runtime.trainers=4"]))
    # hybrid sharding: what counts is the size of a shard group (trainers / shard_groups), not its spelling
    hybrid = ["train.sharding=fsdp", "runtime.mode=gap_tsp_tag", "runtime.trainers=4", "train.shard_groups=2"]
    saved = load_config(None, hybrid).model_dump(mode="json")
    for ok in (["runtime.trainers=2", "train.shard_groups=1"], ["runtime.trainers=6", "train.shard_groups=3"]):
        check_resume_config(saved, load_config(None, [*hybrid, *ok]))
    for bad in (["runtime.trainers=4", "train.shard_groups=1"], ["runtime.trainers=4", "train.shard_groups=4"]):
        with pytest.raises(ConfigError, match=r"runtime\.trainers / train\.shard_groups = 2"):
            check_resume_config(saved, load_config(None, [*hybrid, *bad]))
    replicated = load_config(None, ["runtime.mode=gap_tsp", "runtime.trainers=2"])  # replicas: any number
    check_resume_config(replicated.model_dump(mode="json"), load_config(None, ["runtime.mode=gap_tsp",
                                                                                   "runtime.trainers=4"]))


def test_files_are_atomic_pruned_and_damaged_ones_skipped(tmp_path):
    from digenrl.train.context import build_context

    cfg = load_config(None, [f"run_dir={tmp_path}", "train.ema_decay=0.5"])
    ctx = build_context(cfg)
    for step in (1, 2, 3):
        ckpt.write_checkpoint(tmp_path, step, ckpt.pack_train_state(ctx, step=step, counters={"wall_s": step}), keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_00000002.safetensors", "step_00000003.safetensors"]
    newest = tmp_path / "checkpoints" / names[-1]
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 3])                      # a damaged newest file (e.g. a bad disk)
    assert ckpt.latest_checkpoint(tmp_path).name == names[0]
    (tmp_path / "checkpoints" / ".tmp-step_00000004.safetensors-99").write_bytes(b"torn")  # a killed writer's
    ckpt.write_checkpoint(tmp_path, 4, ckpt.pack_train_state(ctx, step=4), keep=2)
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))
    assert ckpt.latest_checkpoint(tmp_path).name == "step_00000004.safetensors"

    def failing(tmp):
        tmp.write_bytes(b"half")
        raise OSError("disk full")

    from digenrl.safe_files import atomic_write_with

    with pytest.raises(OSError):
        atomic_write_with(tmp_path / "checkpoints" / "step_00000005.safetensors", failing)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir())[-1] == "step_00000004.safetensors"


def test_roundtrip_restores_weights_optimizer_ema_version(tmp_path):
    from product import product_steps

    from digenrl.train.context import build_context

    over = [f"run_dir={tmp_path}", "train.ema_decay=0.9", "train.prompts_per_step=2", "train.generations=4",
            "sampler.num_steps=4"]
    cfg = load_config(None, over)
    ctx = product_steps(cfg, steps=1)[0].ctx
    path = ckpt.write_checkpoint(tmp_path, 1, ckpt.pack_train_state(ctx, step=1), keep=1)
    fresh = build_context(cfg)
    assert _resumed(fresh, path) == 1
    assert fresh.transaction.version == ctx.transaction.version == 1
    for (n, a), (_, b) in zip(ctx.policy.named_parameters(), fresh.policy.named_parameters()):
        assert torch.equal(a, b), n
    sa, sb = ctx.optimizer.state_dict(), fresh.optimizer.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    for i in sa["state"]:
        for k in sa["state"][i]:
            assert torch.equal(sa["state"][i][k], sb["state"][i][k]), (i, k)
    for k in ctx.ema.shadow:
        assert torch.equal(ctx.ema.shadow[k], fresh.ema.shadow[k]), k


def test_fp16_loss_scale_is_resumed(tmp_path):
    """fp16's dynamic loss scale S, its good-commit count and its skip count come back as they were at the
    checkpoint (before, a resumed run restarted at tuning.loss_scale_init: a different S, so different fp16
    gradients than the uninterrupted run's)."""
    from digenrl.train.context import build_context

    cfg = load_config(None, [f"run_dir={tmp_path}", "train.mixed_precision=fp16", "train.prompts_per_step=2",
                             "train.generations=4", "sampler.num_steps=4"])
    ctx = build_context(cfg)
    prec = ctx.transaction.precision
    for finite in (False, True, True, False, True):  # a history: S = 65536 / 2 / 2, 1 good commit since, 2 skips
        prec.update(finite)
    path = ckpt.write_checkpoint(tmp_path, 1, ckpt.pack_train_state(ctx, step=1), keep=1)
    fresh = build_context(cfg)
    assert fresh.transaction.precision.scale == 65536.0
    _resumed(fresh, path)
    got = fresh.transaction.precision
    assert (got.scale, got.skipped) == (65536.0 / 4, 2)
    got.update(True)  # growth_interval later, not sooner: the good-commit count came back too
    assert got._good_steps == 2 == prec._good_steps + 1


@pytest.fixture(scope="module")
def sd3_lora(tmp_path_factory) -> list[str]:
    """Overrides of a tiny SD3 LoRA run (random model, prompt cache, no text encoders)."""
    root = tmp_path_factory.mktemp("sd3")
    model = td.save_sd3(root / "sd3")
    prompts = root / "p.txt"
    prompts.write_text("a red cat\na big dog\n")
    td.random_cache(root / "cache", "sd3-test", ["a red cat", "a big dog", ""], td.SD3_COND)
    return [
        "model.kind=sd3", f"model.path={model}", f"model.prompt_cache_dir={root}/cache",
        "model.options={height: 16, width: 16}", "model.lora.enabled=true", "model.lora.rank=2", "task.name=text",
        f"task.prompts_file={prompts}", "reward={jpeg_incompressibility: {weight: 1}}", "sampler.num_steps=3",
        "train.prompts_per_step=2", "train.generations=2", "train.chunk_generations=2", "eval.num_prompts=2",
        "eval.grid_prompts=2", "eval.every=0", "log.progress=false", "train.lr=0.01"]  # fmt: skip


def test_lora_checkpoint_holds_adapters_and_their_optimizer_state_only(tmp_path, sd3_lora):
    from product import product_steps

    from digenrl.train.context import build_context

    cfg = load_config(None, [f"run_dir={tmp_path}/run", *sd3_lora])
    ctx = product_steps(cfg, steps=1)[0].ctx
    path = ckpt.write_checkpoint(tmp_path / "run", 1, ckpt.pack_train_state(ctx, step=1), keep=1)
    state = ckpt.read_train_state(path)
    trainable = [n for n, p in ctx.policy.named_parameters() if p.requires_grad]
    assert list(state.model) == trainable and all("lora" in n for n in trainable)
    assert len(state.optimizer["state"]) == len(trainable)
    frozen = sum(p.numel() for p in ctx.policy.parameters() if not p.requires_grad)
    stored = sum(t.numel() for t in state.model.values())
    assert stored < frozen / 5                                          # no copy of the frozen base
    fresh = build_context(cfg)
    ckpt.restore_train_state(fresh, state)
    for (n, a), (_, b) in zip(ctx.policy.named_parameters(), fresh.policy.named_parameters()):
        assert torch.equal(a, b), n
    meta = json.loads(__import__("safetensors").safe_open(str(path), "pt").metadata()[ckpt.META_KEY])
    assert meta["config_hash"] == config_hash(cfg)


def test_bytes_and_file_give_the_same_state(tmp_path):
    from digenrl.train.context import build_context

    ctx = build_context(load_config(None, [f"run_dir={tmp_path}"]))
    data = ckpt.pack_train_state(ctx, step=0, counters={"x": 1})
    path = ckpt.write_checkpoint(tmp_path, 0, data, keep=1)
    a, b = ckpt.unpack(data), ckpt.read_train_state(path)
    assert (a.step, a.version, a.counters, a.config) == (b.step, b.version, b.counters, b.config)
    assert all(torch.equal(a.model[k], b.model[k]) for k in a.model) and list(a.model) == list(b.model)
    with pytest.raises(ValueError, match="not a resumable checkpoint"):
        ckpt.read_train_state(_plain(tmp_path))


def _plain(tmp_path):
    from safetensors.torch import save_file

    p = tmp_path / "plain.safetensors"
    save_file({"w": torch.zeros(2)}, str(p))
    return p


def test_a_diffusers_run_checkpoint_loads_back_through_model_checkpoint(tmp_path, sd3_lora, capsys):
    from digenrl.cli import main
    from digenrl.models.registry import build_policy
    from product import product_steps

    from digenrl.runtime.driver import run_training
    from digenrl.train.context import build_context

    # (no EMA: the final checkpoint is then exactly the trained weights, the same step in this process below)
    cfg = load_config(None, [f"run_dir={tmp_path}/run", "steps=1", "train.ema_decay=null", *sd3_lora])
    run_training(cfg)
    ctx = product_steps(cfg)[0].ctx
    trained = {n: p.detach().clone() for n, p in ctx.policy.named_parameters() if p.requires_grad}
    base = build_context(cfg).policy
    assert any(not torch.equal(p, trained[n]) for n, p in base.named_parameters() if p.requires_grad)
    cfg2 = load_config(None, [*sd3_lora, f"model.checkpoint={tmp_path}/run/checkpoint.safetensors"])
    loaded = build_policy(cfg2.model)
    for n, p in loaded.named_parameters():
        if p.requires_grad:
            assert torch.equal(p, trained[n]), n
    assert main(["eval", *sd3_lora, f"model.checkpoint={tmp_path}/run/checkpoint.safetensors"]) == 0
    # without the run's LoRA settings the adapters have nowhere to go: refused, naming the key
    assert main(["eval", *[o for o in sd3_lora if "lora" not in o],
                 f"model.checkpoint={tmp_path}/run/checkpoint.safetensors"]) == 2
    assert "model.checkpoint" in capsys.readouterr().err


def _resumed(ctx, path) -> int:
    """Restore ``ctx`` from the checkpoint file ``path`` (what a resumed worker does); its step."""
    state = ckpt.read_train_state(path)
    ckpt.restore_train_state(ctx, state)
    return state.step
