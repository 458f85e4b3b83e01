"""EMA of the trainable parameters: ema <- d_n * ema + (1 - d_n) * theta, swapped in only temporarily.

Flow-GRPO's EMAModuleWrapper: d_n = min((1 + n) / (10 + n), decay) after optimizer step n, applied when
(n + 1) % update_step_interval == 0."""

import pytest
import torch

from digenrl.train.ema import ParamEMA


def test_ema_update_and_swap():
    lin = torch.nn.Linear(2, 2)
    lin.bias.requires_grad_(False)  # frozen tensors are not shadowed
    w0 = lin.weight.detach().clone()
    ema = ParamEMA(lin, decay=0.9, warmup=False)
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


@pytest.mark.parametrize("every", [1, 3])
def test_ema_warmup_schedule_of_flow_grpo(every):
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2, bias=False)
    ema = ParamEMA(lin, decay=0.9, every=every)
    ref = lin.weight.detach().clone()
    for n in range(1, 25):  # n = optimizer steps done so far (Flow-GRPO's global_step)
        with torch.no_grad():
            lin.weight.add_(torch.randn_like(lin.weight))
        ema.update()
        if (n + 1) % every == 0:
            d = min((1 + n) / (10 + n), 0.9)
            ref = ref + (1 - d) * (lin.weight.detach() - ref)
        torch.testing.assert_close(ema.shadow["weight"], ref)
    assert min((1 + 24) / (10 + 24), 0.9) < 0.9  # the warm-up is still acting at n = 24
    with pytest.raises(ValueError, match="ema_every"):
        ParamEMA(lin, decay=0.9, every=0)


def test_run_with_ema_evaluates_the_ema_weights(tmp_path):
    """With ema_decay the saved checkpoint holds the EMA weights, not the live ones."""
    from safetensors.torch import load_file

    from product import product_steps

    from digenrl.config import load_config
    from digenrl.runtime.driver import run_training

    cfg = load_config(None, [f"run_dir={tmp_path}", "steps=2", "train.prompts_per_step=2", "train.generations=4",
                             "sampler.num_steps=4", "eval.num_prompts=2", "eval.every=0", "log.progress=false",
                             "train.ema_decay=0.5"])
    run_training(cfg)
    ctx = product_steps(cfg)[0].ctx  # the same steps in this process: the weights and the EMA the run ended with
    saved = load_file(str(tmp_path / "checkpoint.safetensors"))
    for name, value in ctx.ema.shadow.items():
        torch.testing.assert_close(saved[name], value)
    live = dict(ctx.policy.named_parameters())
    assert any(not torch.equal(saved[n], live[n].detach()) for n in ctx.ema.shadow)
