"""A task reading prompts from a file: plain text (one prompt per line) or JSONL (``{"prompt": ...}`` per line).

Formats, chosen by the suffix: ``.jsonl`` / ``.json`` -> JSONL, anything else -> plain text. Blank lines are
skipped in both; in JSONL every other line must be a JSON object with a non-empty string ``prompt`` (its other
keys go to ``Prompt.meta``, e.g. GenEval metadata for a reward). A prompt's ``uid`` is its 0-based index among
the file's prompts (stable across steps and processes). Malformed input raises ``PromptFileError`` naming the
file and the 1-based line.

A directory stands for a Flow-GRPO dataset (``dataset=dataset/ocr``): its ``train.txt`` / ``test.txt``
(``TextPromptDataset``) or ``train_metadata.jsonl`` / ``test_metadata.jsonl`` (``GenevalPromptDataset``); the
test split is the eval set unless an eval file is given (``dataset_files``). ``eval_prompts(n)``: the eval
file's first ``n`` prompts (the train file's if none is given).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from digenrl.algo.timesteps import stable_seed
from digenrl.rollout.records import Prompt


class PromptFileError(ValueError):
    """A prompt file is missing, empty or malformed; the message names the file (and line)."""


SPLITS = (("train.txt", "test.txt"), ("train_metadata.jsonl", "test_metadata.jsonl"))  # Flow-GRPO's layouts


def dataset_files(prompts_file: str | Path, eval_prompts_file: str | Path | None = None) -> tuple[Path, Path | None]:
    """(train file, eval file or None) of a prompt file or a dataset directory (see the module docstring);
    ``eval_prompts_file`` may be a directory too (its test split)."""
    train, ev = Path(prompts_file).expanduser(), None
    if train.is_dir():
        found = [(train / a, train / b) for a, b in SPLITS if (train / a).is_file()]
        if not found:
            raise PromptFileError(f"dataset directory {str(train)!r} holds no {' or '.join(a for a, _ in SPLITS)}")
        if len(found) > 1:
            raise PromptFileError(f"dataset directory {str(train)!r} holds both {found[0][0].name} and "
                                  f"{found[1][0].name}; pass the file to use")
        train, test = found[0]
        ev = test if test.is_file() else None
    if eval_prompts_file:
        ev = Path(eval_prompts_file).expanduser()
        if ev.is_dir():
            tests = [ev / b for _, b in SPLITS if (ev / b).is_file()]
            if len(tests) != 1:
                raise PromptFileError(f"dataset directory {str(ev)!r} holds "
                                      f"{'no ' + ' or '.join(b for _, b in SPLITS) if not tests else 'several test files'}")
            ev = tests[0]
    return train, ev


def read_prompt_file(path: str | Path) -> list[Prompt]:
    p = Path(path).expanduser()
    if not p.is_file():
        raise PromptFileError(f"prompt file {str(p)!r} does not exist")
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise PromptFileError(f"prompt file {str(p)!r} is not UTF-8 text: {e}") from None
    jsonl = p.suffix.lower() in (".jsonl", ".json")
    prompts: list[Prompt] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if not jsonl:
            prompts.append(Prompt(uid=len(prompts), text=line.strip()))
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptFileError(f"{p}:{lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise PromptFileError(f"{p}:{lineno}: expected a JSON object like {{\"prompt\": ...}}, got {type(obj).__name__}")
        text = obj.get("prompt")
        if not isinstance(text, str) or not text.strip():
            raise PromptFileError(f"{p}:{lineno}: missing or empty string field \"prompt\"")
        meta = {k: v for k, v in obj.items() if k != "prompt"}
        prompts.append(Prompt(uid=len(prompts), text=text.strip(), meta=meta))
    if not prompts:
        raise PromptFileError(f"prompt file {str(p)!r} holds no prompts")
    return prompts


class TextPromptTask:
    name = "text"

    def __init__(self, prompts_file: str | Path, eval_prompts_file: str | Path | None = None):
        train, ev = dataset_files(prompts_file, eval_prompts_file)
        self.train = read_prompt_file(train)
        self.eval = read_prompt_file(ev) if ev else self.train
        self.prompts_file = str(train)

    def train_prompts(self, step: int, n: int, seed: int = 0) -> list[Prompt]:
        """``n`` distinct prompts drawn by a generator seeded by (seed, step) only: every executor and mode sees the
        same prompts at step k."""
        if n > len(self.train):
            raise ValueError(
                f"train.prompts_per_step={n} exceeds the {len(self.train)} prompts of {self.prompts_file!r}"
            )
        rng = random.Random(stable_seed(int(seed), int(step), "text-prompts"))
        return [self.train[i] for i in rng.sample(range(len(self.train)), n)]

    def eval_prompts(self, n: int) -> list[Prompt]:
        return self.eval[: min(n, len(self.eval))]

    def all_texts(self) -> list[str]:
        """Every train and eval prompt text (what a prompt-embedding cache must hold)."""
        return list(dict.fromkeys([p.text for p in self.train] + [p.text for p in self.eval]))
