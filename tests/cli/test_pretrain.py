"""`digenrl pretrain` is reproducible from its seed (short runs; the committed assets use the defaults)."""

import hashlib
import json

from digenrl.cli import main


def _digest(path):
    """Hash of the tensors and metadata (safetensors' header key order is not stable, so not the raw bytes)."""
    from safetensors import safe_open

    h = hashlib.sha256()
    with safe_open(str(path), framework="pt") as f:
        h.update(json.dumps(f.metadata(), sort_keys=True).encode())
        for k in sorted(f.keys()):
            h.update(k.encode())
            h.update(f.get_tensor(k).numpy().tobytes())
    return h.hexdigest()


def test_pretrain_base_same_seed_same_file(tmp_path):
    a, b, c = tmp_path / "a.safetensors", tmp_path / "b.safetensors", tmp_path / "c.safetensors"
    assert main(["pretrain", "base", "--iters", "3", "--out", str(a)]) == 0
    assert main(["pretrain", "base", "--iters", "3", "--out", str(b)]) == 0
    assert main(["pretrain", "base", "--iters", "3", "--seed", "1", "--out", str(c)]) == 0
    assert _digest(a) == _digest(b) != _digest(c)
    from digenrl.models.tiny_dit import TinyDiTPolicy

    TinyDiTPolicy.load(a)


def test_pretrain_classifier_same_seed_same_file(tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    assert main(["pretrain", "classifier", "--iters", "1", "--out", str(a)]) == 0
    assert main(["pretrain", "classifier", "--iters", "1", "--out", str(b)]) == 0
    assert _digest(a) == _digest(b)


def test_committed_assets_meet_demo_contract():
    """The shipped base leaves headroom: its eval reward (ODE, fixed prompts) is at most 0.7."""
    from digenrl.config import load_config
    from digenrl.train.context import build_context
    from digenrl.train.evaluate import evaluate

    cfg = load_config(None, [])
    ctx = build_context(cfg)
    r, _ = evaluate(ctx.policy, ctx.task.eval_prompts(cfg.eval.num_prompts), ctx.reward, ctx.sampler, run_seed=cfg.seed)
    assert 0.2 < r <= 0.7
