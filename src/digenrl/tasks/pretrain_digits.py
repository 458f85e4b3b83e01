"""Flow-matching pre-training of the demo base generator (``digenrl pretrain base``).

Rectified-flow objective with the sigma convention of docs/architecture.md::

    x_sigma = (1 - sigma) x_0 + sigma eps,   target v = eps - x_0,   L = E || v_theta(x_sigma, sigma, c) - v ||^2

sigma ~ logit-normal(0, 1) (SD3's choice), caption tokens dropped to the null token with probability
``cond_dropout`` (for CFG). The corpus has noisy captions (``tasks.digits.DigitCanvasSampler``), which leaves
the RL headroom the demo needs. Everything is seeded: the same seed gives the same file.
"""

from __future__ import annotations

from pathlib import Path

import torch

from digenrl.models.tiny_dit import DEFAULT_BASE, TinyDiTConfig, TinyDiTPolicy


def pretrain_base(
    seed: int = 0,
    iters: int = 3000,
    batch: int = 96,
    lr: float = 1e-3,
    caption_noise: float = 0.3,
    cond_dropout: float = 0.1,
    out: str | Path = DEFAULT_BASE,
    cfg: TinyDiTConfig | None = None,
    progress: bool = True,
) -> TinyDiTPolicy:
    from tqdm import tqdm

    from digenrl.tasks.digits import NULL, DigitCanvasSampler, load_digit_images

    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    images, labels = load_digit_images()
    data = DigitCanvasSampler(images, labels, caption_noise=caption_noise)
    policy = TinyDiTPolicy(cfg)
    opt = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=iters, pct_start=0.05)
    bar = tqdm(range(iters), desc="pretrain base", disable=not progress)
    ema = None
    for _ in bar:
        x0, tokens = data.batch(batch, g)
        drop = torch.rand(batch, generator=g) < cond_dropout
        tokens[drop] = NULL
        sigma = torch.sigmoid(torch.randn(batch, generator=g))
        eps = torch.randn(x0.shape, generator=g)
        s = sigma[:, None, None, None]
        xs = (1 - s) * x0 + s * eps
        loss = ((policy(xs, sigma, {"tokens": tokens}) - (eps - x0)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        bar.set_postfix(loss=f"{ema:.4f}")
    policy.save(out, {"seed": str(seed), "iters": str(iters), "caption_noise": str(caption_noise)})
    return policy
