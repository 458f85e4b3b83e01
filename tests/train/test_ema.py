"""EMA of the trainable parameters: ema <- d * ema + (1 - d) * theta, swapped in only temporarily."""

import pytest
import torch

from digenrl.train.ema import ParamEMA


def test_ema_update_and_swap():
    lin = torch.nn.Linear(2, 2)
    lin.bias.requires_grad_(False)  # frozen tensors are not shadowed
    w0 = lin.weight.detach().clone()
    ema = ParamEMA(lin, decay=0.9)
    assert set(ema.shadow) == {"weight"}
    with torch.no_grad():
        lin.weight.add_(1.0)
    ema.update()
    expected = 0.9 * w0 + 0.1 * (w0 + 1.0)
    torch.testing.assert_close(ema.shadow["weight"], expected)
    live = lin.weight.detach().clone()
    with ema.swapped():
        torch.testing.assert_close(lin.weight.detach(), expected)
    torch.testing.assert_close(lin.weight.detach(), live)
    with pytest.raises(ValueError, match="ema_decay"):
        ParamEMA(lin, decay=1.0)


def test_run_with_ema_evaluates_the_ema_weights(tmp_path):
    """With ema_decay the saved checkpoint holds the EMA weights, not the live ones."""
    from safetensors.torch import load_file

    from digenrl.config import load_config
    from digenrl.train.context import build_context
    from digenrl.train.loop import run_training

    cfg = load_config(None, [f"run_dir={tmp_path}", "steps=2", "train.prompts_per_step=2", "train.generations=4",
                             "sampler.num_steps=4", "eval.num_prompts=2", "eval.every=0", "log.progress=false",
                             "train.ema_decay=0.5"])
    ctx = build_context(cfg)
    run_training(cfg, ctx=ctx)
    saved = load_file(str(tmp_path / "checkpoint.safetensors"))
    for name, value in ctx.ema.shadow.items():
        torch.testing.assert_close(saved[name], value)
    live = dict(ctx.policy.named_parameters())
    assert any(not torch.equal(saved[n], live[n].detach()) for n in ctx.ema.shadow)
