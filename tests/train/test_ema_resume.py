"""A resumed run's EMA continues the uninterrupted run's: the update count (on which the warm-up decay
d_n = min((1 + n) / (10 + n), decay) and the ``ema_every`` interval depend) is restored with the shadow."""

from __future__ import annotations

import pytest
import torch

from digenrl.config import load_config
from digenrl.train import checkpoint as ckpt


@pytest.mark.parametrize("every", [1, 2])
def test_resumed_ema_equals_the_uninterrupted_ema(tmp_path, every):
    from product import product_steps

    from digenrl.train.context import build_context

    cfg = load_config(None, [f"run_dir={tmp_path}", "train.ema_decay=0.9", f"train.ema_every={every}",
                             "train.prompts_per_step=2", "train.generations=4", "sampler.num_steps=4"])
    worker, _ = product_steps(cfg, steps=2)
    ctx = worker.ctx
    path = ckpt.write_checkpoint(tmp_path, 2, ckpt.pack_train_state(ctx, step=2), keep=1)
    fresh = build_context(cfg)
    assert _resumed(fresh, path) == 2
    assert fresh.ema.num_updates == ctx.ema.num_updates == 2
    for k in ctx.ema.shadow:
        assert torch.equal(fresh.ema.shadow[k], ctx.ema.shadow[k]), k
    # one more step on both: the same weights, and the same EMA (a count restarted at 0 gives d_1 = 2/11 instead
    # of d_3 = 4/13, and with every = 2 an update on the wrong parity)
    product_steps(cfg, steps=1, first=2, worker=worker)
    fresh = product_steps(cfg, steps=1, state=path.read_bytes())[0].ctx  # a resumed worker's next step
    for (n, a), (_, b) in zip(ctx.policy.named_parameters(), fresh.policy.named_parameters()):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=n)
    moved = 0
    for k in ctx.ema.shadow:
        torch.testing.assert_close(fresh.ema.shadow[k], ctx.ema.shadow[k], rtol=1e-6, atol=1e-9, msg=k)
        moved += int(not torch.equal(ctx.ema.shadow[k], dict(ctx.policy.named_parameters())[k]))
    assert moved > 0  # the EMA is not simply the weights (the check would hold for any count)


def _resumed(ctx, path) -> int:
    """Restore ``ctx`` from the checkpoint file ``path`` (what a resumed worker does); its step."""
    state = ckpt.read_train_state(path)
    ckpt.restore_train_state(ctx, state)
    return state.step
