"""The digits-task reward: a small CNN classifier's probability that the canvas matches its prompt.

For a canvas with slots (left, right) and prompt tokens (a, b) (``tasks.digits``; 10 = blank)::

    r = p_cls(a | left slot) * p_cls(b | right slot)

i.e. the probability that both slots hold what the prompt names (slots scored independently). The classifier
has 11 classes (digits 0-9 and blank), is trained by ``digenrl pretrain classifier`` on scikit-learn's digits,
and ships as ``assets/digits_classifier.safetensors``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from digenrl.rollout.records import Prompt

ASSET = Path(__file__).resolve().parent.parent / "assets" / "digits_classifier.safetensors"


class DigitClassifier(nn.Module):
    """8x8 slot in [-1, 1] -> 11 logits (0-9, blank)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 2 * 2, 128), nn.ReLU(), nn.Linear(128, 11),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def train_classifier(seed: int = 0, epochs: int = 40, out: str | Path = ASSET, log=print) -> dict[str, float]:
    """Train on 80% of sklearn's digits plus blank slots, report held-out accuracy, save safetensors."""
    from safetensors.torch import save_file

    from digenrl.tasks.digits import load_digit_images

    torch.manual_seed(seed)
    images, labels = load_digit_images()
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(images), generator=g)
    n_train = int(0.8 * len(images))
    tr, te = perm[:n_train], perm[n_train:]

    def with_blanks(idx: torch.Tensor, n_blank: int) -> tuple[torch.Tensor, torch.Tensor]:
        blanks = -1.0 + 0.05 * torch.rand(n_blank, 8, 8, generator=g)
        x = torch.cat([images[idx], blanks]).unsqueeze(1)
        y = torch.cat([labels[idx], torch.full((n_blank,), 10)])
        return x, y

    x_tr, y_tr = with_blanks(tr, n_train // 10)
    x_te, y_te = with_blanks(te, len(te) // 10)
    model = DigitClassifier()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    for epoch in range(epochs):
        order = torch.randperm(len(x_tr), generator=g)
        for i in range(0, len(order), 64):
            b = order[i : i + 64]
            xb = x_tr[b] + 0.05 * torch.randn(x_tr[b].shape, generator=g)  # mild pixel noise augmentation
            loss = nn.functional.cross_entropy(model(xb), y_tr[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        acc = (model(x_te).argmax(-1) == y_te).float().mean().item()
    log(f"classifier held-out accuracy: {acc:.4f} ({len(x_te)} slots)")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out), metadata={"seed": str(seed), "heldout_acc": f"{acc:.4f}"})
    return {"heldout_acc": acc}


def load_classifier(path: str | Path = ASSET) -> DigitClassifier:
    from safetensors.torch import load_file

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(
            f"reward.digits.classifier_path: {str(p)!r} does not exist (make it with `digenrl pretrain classifier`)"
        )
    model = DigitClassifier()
    model.load_state_dict(load_file(str(p)))
    return model.eval()


class DigitsReward:
    """r = p(left slot = prompt's left) * p(right slot = prompt's right); images in [0, 1], [B, 1, 8, 16]."""

    name = "digits"

    def __init__(self, classifier_path: str | None = None):
        self.classifier = load_classifier(classifier_path or ASSET)
        for prm in self.classifier.parameters():
            prm.requires_grad_(False)

    @torch.no_grad()
    def slot_probs(self, images: torch.Tensor, prompts: Sequence[Prompt]) -> torch.Tensor:
        """[B, 2]: probability of the named class in the left and right slot. Each slot is classified alone: the
        CPU kernels of a batch round differently with its size (1.8e-6 relative on one sample), so a sample
        scored in a generator's fragment and in a TAG rank's share of it would get different rewards, and the
        run's result would depend on which worker generated what (issue 40; I5 at the level of the score)."""
        x = images.float().cpu() * 2.0 - 1.0
        slots = torch.cat([x[..., :8], x[..., 8:16]])  # [2B, 1, 8, 8]
        probs = torch.softmax(torch.cat([self.classifier(s[None]) for s in slots]), dim=-1)
        b = images.shape[0]
        targets = torch.tensor([[p.meta["left"], p.meta["right"]] for p in prompts], dtype=torch.long)
        left = probs[:b].gather(1, targets[:, :1]).squeeze(1)
        right = probs[b:].gather(1, targets[:, 1:]).squeeze(1)
        return torch.stack([left, right], dim=1)

    def __call__(self, images: torch.Tensor, prompts: Sequence[Prompt]) -> torch.Tensor:
        return self.slot_probs(images, prompts).prod(dim=1)

