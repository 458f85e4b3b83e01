"""On-disk cache of prompt embeddings, so training workers need no text encoders.

Text encoders (CLIP, T5, UMT5, Qwen2.5-VL, Llama) are often larger than the LoRA-trained transformer and are
used only to turn prompts into conditions. They run once per prompt set; the per-prompt rows of the ``Cond``
are stored as one safetensors file per prompt::

    <cache_dir>/manifest.json                  {"encoder_ids": [...]}
    <cache_dir>/<key>.safetensors              tensors of one prompt (no batch dim), metadata: prompt, encoder_id
    key = sha256(encoder_id + "\\n" + prompt_text)[:40]

``encoder_id`` names the family, the text-encoder/tokenizer configs and the encoding options (e.g. the maximum
sequence length), so a different encoder or option never reads stale rows. A cache directory shipped without
the text encoders is usable on its own: the adapter reads the encoder id from ``manifest.json``.
Writes go through a temporary file and ``os.replace`` (safe with several workers sharing the directory).
An in-memory layer keeps rows already read.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Sequence

import torch

from digenrl.models.base import Cond

MANIFEST = "manifest.json"


class PromptCacheMiss(ValueError):
    """Prompts absent from the cache while no text encoder is loaded."""


def encoder_identity(family: str, config_files: Sequence[Path], options: dict) -> str:
    """A stable id of (family, text-encoder/tokenizer config contents, encoding options)."""
    h = hashlib.sha256()
    h.update(family.encode())
    for f in sorted(config_files, key=lambda p: str(p.parent.name) + p.name):
        h.update(f"{f.parent.name}/{f.name}".encode())
        h.update(f.read_bytes())
    h.update(json.dumps(options, sort_keys=True).encode())
    return f"{family}-{h.hexdigest()[:16]}"


def prompt_key(encoder_id: str, text: str) -> str:
    return hashlib.sha256(f"{encoder_id}\n{text}".encode()).hexdigest()[:40]


class PromptCache:
    """Per-prompt condition rows for one encoder id, on disk (``cache_dir``) or only in memory (``None``)."""

    def __init__(self, cache_dir: str | os.PathLike | None, encoder_id: str):
        self.dir = Path(cache_dir).expanduser() if cache_dir is not None else None
        self.encoder_id = encoder_id
        self._mem: dict[str, dict[str, torch.Tensor]] = {}
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._register_encoder()

    # -- manifest -------------------------------------------------------------------------------------------
    @staticmethod
    def read_encoder_ids(cache_dir: str | os.PathLike) -> list[str]:
        path = Path(cache_dir).expanduser() / MANIFEST
        if not path.is_file():
            return []
        try:
            return list(json.loads(path.read_text()).get("encoder_ids", []))
        except json.JSONDecodeError as e:
            raise ValueError(f"prompt cache manifest {str(path)!r} is not valid JSON: {e}") from None

    def _register_encoder(self) -> None:
        ids = self.read_encoder_ids(self.dir)
        if self.encoder_id not in ids:
            _atomic_write(self.dir / MANIFEST, json.dumps({"encoder_ids": ids + [self.encoder_id]}).encode())

    # -- rows -----------------------------------------------------------------------------------------------
    def _file(self, text: str) -> Path:
        assert self.dir is not None
        return self.dir / f"{prompt_key(self.encoder_id, text)}.safetensors"

    def get_row(self, text: str) -> dict[str, torch.Tensor] | None:
        row = self._mem.get(text)
        if row is None and self.dir is not None:
            f = self._file(text)
            if f.is_file():
                from safetensors.torch import load_file

                row = load_file(str(f))
                self._mem[text] = row
        return row

    def missing(self, texts: Sequence[str]) -> list[str]:
        seen: set[str] = set()
        out = []
        for t in texts:
            if t not in seen and self.get_row(t) is None:
                out.append(t)
            seen.add(t)
        return out

    def put(self, texts: Sequence[str], cond: Cond) -> None:
        """Store row i of every tensor of ``cond`` under ``texts[i]``."""
        for i, text in enumerate(texts):
            row = {k: v[i].detach().to("cpu").contiguous() for k, v in cond.items()}
            self._mem[text] = row
            if self.dir is not None:
                from safetensors.torch import save

                meta = {"prompt": text, "encoder_id": self.encoder_id}
                _atomic_write(self._file(text), save(row, metadata=meta))

    def get(self, texts: Sequence[str]) -> Cond:
        """Stack the cached rows of ``texts`` (all must be present) into a batch-first ``Cond``."""
        rows = []
        for t in texts:
            row = self.get_row(t)
            if row is None:
                where = str(self.dir) if self.dir is not None else "memory"
                raise PromptCacheMiss(f"prompt {t!r} is not in the prompt cache ({where}, encoder {self.encoder_id})")
            rows.append(row)
        return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}

    def __len__(self) -> int:
        return len(self._mem)


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=str(path.parent), prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv: list[str] | None = None) -> int:
    """``digenrl cache-prompts --config X [key=value ...]``: encode the task's prompt files into the cache."""
    import argparse

    from digenrl.config import ConfigError, load_config

    ap = argparse.ArgumentParser(prog="digenrl cache-prompts", description=main.__doc__)
    ap.add_argument("--config", default=None, help="run config YAML (optional: overrides alone also work)")
    ap.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = ap.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {e}")
        return 2
    if not cfg.model.prompt_cache_dir:
        print("error: model.prompt_cache_dir must be set to build a prompt cache")
        return 2
    from digenrl.models.registry import build_policy
    from digenrl.tasks.text_prompts import read_prompt_file

    texts: list[str] = []
    try:
        for f in (cfg.task.prompts_file, cfg.task.eval_prompts_file):
            if f:
                texts += [p.text for p in read_prompt_file(f)]
        if not texts:
            raise ValueError("task.prompts_file: no prompt file to cache")
        policy = build_policy(cfg.model)
    except ValueError as e:
        print(f"error: {e}")
        return 2
    n = policy.cache_prompts(texts, drop_encoders=True)
    print(f"cached {n} new prompt embeddings in {cfg.model.prompt_cache_dir}")
    return 0
