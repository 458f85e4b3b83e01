"""The built-in demo task: two-slot digit canvases (a tiny, verifiable, GenEval-like task).

A canvas is 8 x 16 pixels in [-1, 1] (-1 = background): a left and a right 8 x 8 slot, each holding one of
scikit-learn's handwritten digits (1797 real 8 x 8 scans, shipped inside the package) or nothing. A prompt
names the content of both slots, e.g. "3 left, 7 right" or "blank left, 5 right": 11 x 11 - 1 = 120 prompts.
The reward (``rewards.digits``) is a classifier's probability that each slot holds what the prompt names.

Headroom by design: the pre-training corpus of the base generator has noisy captions, like web data:
with probability ``caption_noise`` a canvas's slots are swapped or one digit is replaced, so the base model
follows position and identity only most of the time (GenEval's "position" and "counting" failures in
miniature). RL with the classifier reward removes those modes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch

from digenrl.rollout.records import Prompt

BLANK = 10  # slot token for an empty slot
NULL = 11  # unconditional token (CFG)


def slot_name(token: int) -> str:
    return "blank" if token == BLANK else str(token)


def make_prompt(left: int, right: int) -> Prompt:
    uid = left * 11 + right
    return Prompt(uid=uid, text=f"{slot_name(left)} left, {slot_name(right)} right", meta={"left": left, "right": right})


ALL_PAIRS = [(a, b) for a in range(11) for b in range(11) if not (a == BLANK and b == BLANK)]


def load_digit_images() -> tuple[torch.Tensor, torch.Tensor]:
    """sklearn's 8x8 digits as float32 in [-1, 1] ([N, 8, 8], -1 = background) and labels [N]."""
    from sklearn.datasets import load_digits

    d = load_digits()
    images = torch.from_numpy(d.images.astype(np.float32) / 16.0 * 2.0 - 1.0)
    return images, torch.from_numpy(d.target.astype(np.int64))


@dataclass
class DigitCanvasSampler:
    """Draws (canvas, left token, right token) training pairs for the base generator."""

    images: torch.Tensor
    labels: torch.Tensor
    caption_noise: float = 0.0

    def __post_init__(self) -> None:
        self.by_label = [torch.nonzero(self.labels == d).flatten() for d in range(10)]

    def slot(self, token: int, gen: torch.Generator) -> torch.Tensor:
        if token == BLANK:
            return torch.full((8, 8), -1.0)
        pool = self.by_label[token]
        return self.images[pool[torch.randint(len(pool), (1,), generator=gen)]].squeeze(0)

    def batch(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """n canvases [n, 1, 8, 16] and their (possibly noisy) captions as tokens [n, 2]."""
        pair_idx = torch.randint(len(ALL_PAIRS), (n,), generator=gen).tolist()
        canvases, tokens = [], []
        for i in pair_idx:
            left, right = ALL_PAIRS[i]
            canvases.append(torch.cat([self.slot(left, gen), self.slot(right, gen)], dim=1))
            cap_l, cap_r = left, right
            if torch.rand((), generator=gen).item() < self.caption_noise:
                if left != right and torch.rand((), generator=gen).item() < 0.5:
                    cap_l, cap_r = right, left  # position error
                else:  # identity error on one digit slot
                    wrong = int(torch.randint(10, (1,), generator=gen))
                    if cap_l != BLANK and (cap_r == BLANK or torch.rand((), generator=gen).item() < 0.5):
                        cap_l = wrong
                    else:
                        cap_r = wrong
            tokens.append((cap_l, cap_r))
        return torch.stack(canvases).unsqueeze(1), torch.tensor(tokens, dtype=torch.long)


class DigitsTask:
    """Training prompts: P distinct prompts drawn per step from (seed, step); eval: a fixed spread-out set."""

    name = "digits"

    def train_prompts(self, step: int, n: int, seed: int) -> list[Prompt]:
        if n > len(ALL_PAIRS):
            raise ValueError(f"train.prompts_per_step: the digits task has only {len(ALL_PAIRS)} prompts, asked {n}")
        rng = random.Random(f"digits-train-{seed}-{step}")
        return [make_prompt(*ALL_PAIRS[i]) for i in rng.sample(range(len(ALL_PAIRS)), n)]

    def eval_prompts(self, n: int) -> list[Prompt]:
        rng = random.Random("digits-eval")
        order = rng.sample(range(len(ALL_PAIRS)), len(ALL_PAIRS))
        return [make_prompt(*ALL_PAIRS[i]) for i in order[: min(n, len(ALL_PAIRS))]]
