"""On-disk cache of prompt embeddings, so training workers need no text encoders.

Text encoders (CLIP, T5, UMT5, Qwen2.5-VL, Llama) are often larger than the LoRA-trained transformer and are
used only to turn prompts into conditions. They run once per prompt set (``digenrl cache-prompts``, which
loads only the text encoders); the per-prompt rows of the ``Cond`` are stored as one sharded file set::

    <cache_dir>/manifest.json                       {"encoder_ids": [...]}
    <cache_dir>/shard-<encoder>-<unique>.safetensors  many prompts' rows; tensor "<key>/<field>" = one row of
                                                      one field (no batch dim); metadata: encoder_id
    key = sha256(encoder_id + "\\n" + prompt_text)[:40]

A shard holds up to ``shard_rows`` prompts when written in bulk (``bulk()``), or the rows of one ``put`` (prompts
encoded on the fly during a run). Opening the cache reads only the shard headers (the tensor names) to index
key -> shard; a row is read lazily from its shard when first needed. Shards written by other processes later
are picked up on a miss. Per-prompt files ``<key>.safetensors`` of the earlier layout are still read.

``encoder_id`` names the family, the text-encoder/tokenizer configs and the encoding options (e.g. the maximum
sequence length), so a different encoder or option never reads stale rows. A cache directory shipped without
the text encoders is usable on its own: the adapter reads the encoder id from ``manifest.json``.
Writes are atomic (``digenrl.safe_files``: safe with several workers sharing the directory).
An in-memory LRU layer keeps the ``max_rows`` most recently used rows (older ones are re-read from disk).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Iterator, Sequence

import torch

from digenrl.models.base import Cond
from digenrl.safe_files import atomic_write_bytes as _atomic_write

MANIFEST = "manifest.json"
SHARD_PREFIX = "shard-"


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

    def __init__(self, cache_dir: str | os.PathLike | None, encoder_id: str, max_rows: int = 4096,
                 shard_rows: int = 1024):  # fmt: skip
        if max_rows < 1 or shard_rows < 1:
            raise ValueError(f"prompt cache: max_rows and shard_rows must be >= 1, got {max_rows}, {shard_rows}")
        self.dir = Path(cache_dir).expanduser() if cache_dir is not None else None
        self.encoder_id, self.max_rows, self.shard_rows = encoder_id, int(max_rows), int(shard_rows)
        self._mem: collections.OrderedDict[str, dict[str, torch.Tensor]] = collections.OrderedDict()
        self._pending: dict[str, dict[str, torch.Tensor]] = {}  # written at the end of bulk() (or when full)
        self._bulk = 0
        self._index: dict[str, tuple[Path, list[str]]] = {}  # key -> (shard, fields)
        self._scanned: set[str] = set()
        self._keys: dict[str, str] = {}
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._register_encoder()
            self._scan()

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
        """One encoder id per directory: a directory written by another encoder or other encoding options (e.g.
        ``max_sequence_length``) is refused, never given a second id (which every later run would refuse)."""
        ids = self.read_encoder_ids(self.dir)
        if self.encoder_id in ids:
            return
        if ids:
            raise ValueError(f"model.prompt_cache_dir: {str(self.dir)!r} holds the embeddings of encoder {ids[0]}, "
                             f"not of this run's {self.encoder_id} (another text encoder or other encoding options, "
                             "e.g. model.options.max_sequence_length); use another directory, or delete this one "
                             "and rebuild it with `digenrl cache-prompts`")
        _atomic_write(self.dir / MANIFEST, json.dumps({"encoder_ids": [self.encoder_id]}).encode())

    # -- index ----------------------------------------------------------------------------------------------
    def _scan(self) -> None:
        """Index the shards not seen yet (headers only)."""
        from safetensors import safe_open

        assert self.dir is not None
        for f in sorted(self.dir.glob(f"{SHARD_PREFIX}*.safetensors")):
            if f.name in self._scanned:
                continue
            self._scanned.add(f.name)
            with safe_open(str(f), framework="pt") as st:
                if (st.metadata() or {}).get("encoder_id") != self.encoder_id:
                    continue
                fields: dict[str, list[str]] = collections.defaultdict(list)
                for name in st.keys():
                    key, _, field = name.partition("/")
                    fields[key].append(field)
            for key, names in fields.items():
                self._index[key] = (f, names)

    def _key(self, text: str) -> str:
        key = self._keys.get(text)
        if key is None:
            key = self._keys[text] = prompt_key(self.encoder_id, text)
        return key

    def _read(self, text: str) -> dict[str, torch.Tensor] | None:
        key = self._key(text)
        hit = self._index.get(key)
        if hit is None:
            legacy = self.dir / f"{key}.safetensors"
            if legacy.is_file():
                from safetensors.torch import load_file

                return load_file(str(legacy))
            self._scan()  # another process may have written it since
            hit = self._index.get(key)
            if hit is None:
                return None
        from safetensors import safe_open

        shard, fields = hit
        with safe_open(str(shard), framework="pt") as st:
            return {field: st.get_tensor(f"{key}/{field}") for field in fields}

    def _remember(self, text: str, row: dict[str, torch.Tensor]) -> None:
        self._mem[text] = row
        self._mem.move_to_end(text)
        while len(self._mem) > self.max_rows:
            self._mem.popitem(last=False)

    # -- rows -----------------------------------------------------------------------------------------------
    def get_row(self, text: str) -> dict[str, torch.Tensor] | None:
        row = self._mem.get(text)
        if row is not None:
            self._mem.move_to_end(text)
            return row
        row = self._pending.get(text)
        if row is None and self.dir is not None:
            row = self._read(text)
            if row is not None:
                self._remember(text, row)
        return row

    def uncovered(self, texts: Sequence[str]) -> list[str]:
        """The texts with no row on disk (shard headers and file names only: nothing is loaded)."""
        if self.dir is None:
            return list(dict.fromkeys(texts))
        return [t for t in dict.fromkeys(texts)
                if self._key(t) not in self._index and not (self.dir / f"{self._key(t)}.safetensors").is_file()]

    def missing(self, texts: Sequence[str]) -> list[str]:
        return [t for t in dict.fromkeys(texts) if self.get_row(t) is None]

    def put(self, texts: Sequence[str], cond: Cond) -> None:
        """Store row i of every tensor of ``cond`` under ``texts[i]`` (written now, or at the end of ``bulk()``)."""
        for i, text in enumerate(texts):
            row = {k: v[i].detach().to("cpu").contiguous() for k, v in cond.items()}
            self._remember(text, row)
            if self.dir is not None:
                self._pending[text] = row
        if not self._bulk or len(self._pending) >= self.shard_rows:
            self.flush()

    @contextlib.contextmanager
    def bulk(self) -> Iterator["PromptCache"]:
        """Inside, ``put`` collects rows into shards of up to ``shard_rows`` prompts."""
        self._bulk += 1
        try:
            yield self
        finally:
            self._bulk -= 1
            if not self._bulk:
                self.flush()

    def flush(self) -> None:
        """Write the pending rows as one new shard."""
        if self.dir is None or not self._pending:
            self._pending.clear()
            return
        from safetensors.torch import save

        tensors = {f"{self._key(t)}/{k}": v for t, row in self._pending.items() for k, v in row.items()}
        digest = self.encoder_id.rsplit("-", 1)[-1][:8]
        path = self.dir / f"{SHARD_PREFIX}{digest}-{uuid.uuid4().hex[:16]}.safetensors"
        _atomic_write(path, save(tensors, metadata={"encoder_id": self.encoder_id, "rows": str(len(self._pending))}))
        self._pending.clear()
        self._scan()

    def get(self, texts: Sequence[str]) -> Cond:
        """Stack the cached rows of ``texts`` (all must be present) into a batch-first ``Cond``."""
        rows = []
        for t in texts:
            row = self.get_row(t)
            if row is None:
                where = str(self.dir) if self.dir is not None else "memory"
                raise PromptCacheMiss(f"prompt {t[:200]!r} is not in the prompt cache ({where}, encoder {self.encoder_id})")
            rows.append(row)
        return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}


