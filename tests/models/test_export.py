"""Export of trained runs: `digenrl export` -> diffusers `load_lora_weights` / `from_pretrained` reproduces the
trained policy's ODE sample (tiny SD3); `digenrl eval --checkpoint` scores the trained weights, not the base."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

import tiny_diffusers as td
from test_diffusers_adapters import FAMILIES, STEPS, TEXTS
from digenrl.cli import main
from digenrl.config import dump_config, load_config
from digenrl.models.registry import build_policy
from digenrl.runtime.run_outputs import save_checkpoint
from digenrl.rollout.noise import trajectory_noise, trajectory_seed
from digenrl.rollout.records import Prompt
from digenrl.rollout.sampler import SamplerSettings, sample_trajectories
from digenrl.algo.timesteps import select_timesteps

FAM = FAMILIES["sd3"]
PROMPTS = [Prompt(uid=i, text=t) for i, t in enumerate(TEXTS)]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("sd3")
    path = td.save_sd3(root / "model")
    cache = root / "cache"
    td.random_cache(cache, "sd3-test", TEXTS + [" ", ""], FAM.cond_shapes)
    prompts = root / "prompts.txt"
    prompts.write_text("\n".join(TEXTS) + "\n")
    return path, cache, prompts


def trained_run(base, run_dir, lora: bool):
    """A run directory as a finished run leaves it: config.yaml + checkpoint.safetensors of changed weights."""
    path, cache, prompts = base
    cfg = load_config(None, [
        f"run_dir={run_dir}", "model.kind=sd3", f"model.path={path}", f"model.prompt_cache_dir={cache}",
        f"model.lora.enabled={str(lora).lower()}", "model.lora.rank=4", "model.lora.alpha=8",
        f"model.options={json.dumps(FAM.options)}", "task.name=text", f"task.prompts_file={prompts}",
        f"task.eval_prompts_file={prompts}", "reward={jpeg_incompressibility: {weight: 1.0}}",
        f"sampler.num_steps={STEPS}", f"sampler.cfg_scale={FAM.cfg}", "eval.num_prompts=2",
    ])  # fmt: skip
    torch.manual_seed(0)
    policy = build_policy(cfg.model)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if p.requires_grad and (not lora or "lora_B" in n):
                p.add_(0.3 * torch.randn(p.shape, generator=g) if lora else 0.05 * torch.randn(p.shape, generator=g))
    run_dir.mkdir(parents=True)
    dump_config(cfg, run_dir / "config.yaml")
    save_checkpoint(policy, run_dir, {"steps": "1"})
    return cfg, policy


def ode_sample(policy):
    settings = SamplerSettings(num_steps=STEPS, noise_level=0.0, cfg_scale=FAM.cfg)
    batch = sample_trajectories(policy, PROMPTS, [0, 1], step=0, run_seed=7, version=0, settings=settings,
                                plan=select_timesteps(STEPS))  # fmt: skip
    x_t = torch.stack([trajectory_noise(trajectory_seed(7, 0, p.uid, g), tuple(policy.latent_shape), STEPS)[0]
                       for p, g in zip(PROMPTS, [0, 1])])  # fmt: skip
    return batch.final, x_t


def pipeline_sample(policy, base_path, x_t, lora_dir=None, transformer=None):
    from diffusers import StableDiffusion3Pipeline

    skip = {c: None for c in policy.spec.text_components + policy.spec.extra_components}
    if transformer is not None:
        skip["transformer"] = transformer
    pipe = StableDiffusion3Pipeline.from_pretrained(str(base_path), local_files_only=True, **skip)
    pipe.set_progress_bar_config(disable=True)
    if lora_dir is not None:
        pipe.load_lora_weights(str(lora_dir))
    cond, null = policy.encode_prompts(PROMPTS), policy.null_cond(len(PROMPTS))
    kwargs = FAM.pipeline_kwargs(cond, {k: v.contiguous() for k, v in null.items()})
    return pipe(latents=x_t.clone(), num_inference_steps=STEPS, output_type="latent", **kwargs).images.float()


def test_lora_run_exports_for_load_lora_weights_and_from_pretrained(base, tmp_path, capsys):
    from diffusers import SD3Transformer2DModel

    run = tmp_path / "run"
    _, policy = trained_run(base, run, lora=True)
    ours, x_t = ode_sample(policy)
    assert main(["export", str(run), "--out", str(tmp_path / "lora")]) == 0
    assert (tmp_path / "lora" / "pytorch_lora_weights.safetensors").is_file()
    with_lora = pipeline_sample(policy, base[0], x_t, lora_dir=tmp_path / "lora")
    plain = pipeline_sample(policy, base[0], x_t)
    assert (with_lora - plain).abs().max() > 1e-2  # the adapter changes the sample ...
    err_lora = (with_lora - ours).abs().max().item()
    torch.testing.assert_close(with_lora, ours, atol=2e-4, rtol=1e-4)  # ... into the trained policy's

    assert main(["export", str(run), "--out", str(tmp_path / "merged"), "--format", "full"]) == 0
    merged = SD3Transformer2DModel.from_pretrained(str(tmp_path / "merged"), local_files_only=True)
    assert not any("lora" in n for n, _ in merged.named_parameters())
    err_merged = (pipeline_sample(policy, base[0], x_t, transformer=merged) - ours).abs().max().item()
    with capsys.disabled():
        print(f"\nexport round trip max |error|: lora {err_lora:.2e}, merged {err_merged:.2e}")
    assert err_merged < 2e-4


def test_full_finetune_exports_without_prefix(base, tmp_path, capsys):
    from diffusers import SD3Transformer2DModel

    run = tmp_path / "run"
    _, policy = trained_run(base, run, lora=False)
    with safe_open(str(run / "checkpoint.safetensors"), "pt") as f:
        assert all(k.startswith("transformer.") for k in f.keys())  # the run's own naming
    ours, x_t = ode_sample(policy)
    assert main(["export", str(run), "--out", str(tmp_path / "full")]) == 0
    with safe_open(str(tmp_path / "full" / "diffusion_pytorch_model.safetensors"), "pt") as f:
        assert not any(k.startswith("transformer.") for k in f.keys())
    trained = SD3Transformer2DModel.from_pretrained(str(tmp_path / "full"), local_files_only=True)
    got = pipeline_sample(policy, base[0], x_t, transformer=trained)
    with capsys.disabled():
        print(f"\nexport (full fine-tune) round trip max |error|: {(got - ours).abs().max().item():.2e}")
    torch.testing.assert_close(got, ours, atol=2e-4, rtol=1e-4)
    assert main(["export", str(run), "--out", str(tmp_path / "x"), "--format", "lora"]) == 2
    assert not (tmp_path / "x").exists()
    capsys.readouterr()

    def eval_reward(*extra):  # `eval --checkpoint` takes the exported transformer directory as the run's weights
        assert main(["eval", "--config", str(run / "config.yaml"), *extra]) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    from_run, from_export = eval_reward("--checkpoint", str(run)), eval_reward("--checkpoint", str(tmp_path / "full"))
    assert from_export["checkpoint"].startswith("transformer ")
    assert from_export["eval_reward"] == pytest.approx(from_run["eval_reward"], abs=1e-4)
    assert abs(from_run["eval_reward"] - eval_reward()["eval_reward"]) > 1e-3  # ... and not the base's


def test_eval_scores_the_checkpoint_not_the_base(base, tmp_path, capsys):
    run = tmp_path / "run"
    trained_run(base, run, lora=True)
    assert main(["export", str(run), "--out", str(tmp_path / "lora")]) == 0
    capsys.readouterr()

    def eval_reward(*extra):
        assert main(["eval", "--config", str(run / "config.yaml"), *extra]) == 0
        out = capsys.readouterr()
        return json.loads(out.out.strip().splitlines()[-1]), out.err

    base_r, note = eval_reward()
    assert "scoring the base model" in note
    run_r, _ = eval_reward("--checkpoint", str(run))
    adapter_r, _ = eval_reward("--checkpoint", str(tmp_path / "lora"), "model.lora.enabled=false")
    assert run_r["checkpoint"] and adapter_r["checkpoint"] and base_r["checkpoint"] is None
    assert abs(run_r["eval_reward"] - base_r["eval_reward"]) > 1e-3
    assert adapter_r["eval_reward"] == pytest.approx(run_r["eval_reward"], abs=1e-3)
    assert main(["eval", "--config", str(run / "config.yaml"), "--checkpoint", str(tmp_path / "nope")]) == 2


def test_export_refuses_bad_run_dirs(tmp_path, capsys):
    assert main(["export", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.yaml").write_text("steps: 1\n")
    (tmp_path / "r" / "checkpoint.safetensors").write_bytes(b"\x00" * 10)
    assert main(["export", str(tmp_path / "r"), "--out", str(tmp_path / "o")]) == 2
    assert "safetensors" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_tiny_dit_eval_and_sample_load_a_run_checkpoint(tmp_path, capsys):
    from digenrl.models.tiny_dit import DEFAULT_BASE, TinyDiTPolicy

    run = tmp_path / "run"
    run.mkdir()
    cfg = load_config(None, [f"run_dir={run}", "eval.num_prompts=4", "sampler.num_steps=3"])
    dump_config(cfg, run / "config.yaml")
    policy = TinyDiTPolicy.load(DEFAULT_BASE)
    with torch.no_grad():
        for p in policy.parameters():
            p.mul_(0.5)  # a visibly different "trained" policy
    policy.save(run / "checkpoint.safetensors")

    def eval_reward(*extra):
        assert main(["eval", "--config", str(run / "config.yaml"), *extra]) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["eval_reward"]

    base_r = eval_reward()
    trained_r = eval_reward("--checkpoint", str(run))
    same_r = eval_reward(f"model.path={run / 'checkpoint.safetensors'}")  # the checkpoint as the model itself
    assert trained_r == pytest.approx(same_r, abs=1e-6) and abs(trained_r - base_r) > 1e-3
    assert main(["sample", "--config", str(run / "config.yaml"), "--checkpoint", str(run), "--num", "2",
                 "--out", str(tmp_path / "s.png")]) == 0  # fmt: skip
    assert (tmp_path / "s.png").is_file()
    capsys.readouterr()
    assert main(["export", str(run), "--out", str(tmp_path / "out")]) == 0  # the whole tiny model, as is
    exported = tmp_path / "out" / "model.safetensors"
    assert eval_reward(f"model.path={exported}") == pytest.approx(trained_r, abs=1e-6)
    assert main(["export", str(run), "--out", str(tmp_path / "lora"), "--format", "lora"]) == 2  # no LoRA to export
    assert "no LoRA" in capsys.readouterr().err and not (tmp_path / "lora").exists()
