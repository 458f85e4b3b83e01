"""Durable file writes and cheap safetensors header checks.

Atomic write (a reader sees the old file or the whole new one, never a torn one, even after a power loss)::

    write <dir>/.tmp-<name>-<pid>  ->  fsync(file)  ->  rename over <dir>/<name>  ->  fsync(<dir>)

The rename is atomic on POSIX file systems; the directory fsync makes the rename itself durable. A temp file
left by a killed writer is never read (its name starts with ``.tmp-``) and ``remove_orphans`` deletes it.
This does not rely on the safetensors version: ``save_file`` only ever writes our own temp file.

A safetensors file is ``u64 little-endian N`` + ``N`` bytes of JSON header + the tensor data; the header maps
each tensor name to ``{dtype, shape, data_offsets: [begin, end]}`` relative to the data start (and holds an
optional ``__metadata__`` string map). ``safetensors_header`` reads only the header and checks that every
tensor's bytes lie inside the file, which catches truncated and non-safetensors files without loading them.
"""

from __future__ import annotations

import json
import os
import struct
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

TMP_PREFIX = ".tmp-"
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors reference implementation refuses larger headers too


def _fsync(path: str | os.PathLike) -> None:
    """fsync a file or a directory (opened read-only: a directory cannot be opened for writing)."""
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _tmp_name(path: Path) -> Path:
    return path.with_name(f"{TMP_PREFIX}{path.name}-{os.getpid()}")


@contextmanager
def naming(path: str | os.PathLike, *aliases: str | os.PathLike):
    """Re-raise an ``OSError`` that names no file (a ``write``, ``flush`` or ``fsync`` that hit a full disk: Python
    sets the file name only where a call takes one) or names one of ``aliases`` (a temp file) as the same error
    naming ``path``: the line a user reads says which file could not be written."""
    try:
        yield
    except OSError as e:
        if e.filename is None or str(e.filename) in {str(a) for a in aliases}:
            raise type(e)(e.errno, e.strerror or str(e), str(path)) from e
        raise


def atomic_write_with(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Let ``write(tmp_path)`` produce the file, then fsync + rename it over ``path`` + fsync the directory. An
    ``OSError`` names ``path`` (``naming``), not the temp file."""
    path = Path(path)
    tmp = _tmp_name(path)
    with naming(path, tmp):
        try:
            write(tmp)
            _fsync(tmp)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync(path.parent)
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return atomic_write_with(path, lambda tmp: tmp.write_bytes(data))


def remove_orphans(directory: str | os.PathLike) -> list[Path]:
    """Delete temp files a killed writer left in ``directory``; returns them."""
    d = Path(directory)
    gone = [p for p in d.glob(f"{TMP_PREFIX}*") if p.is_file()] if d.is_dir() else []
    for p in gone:
        p.unlink(missing_ok=True)
    return gone


def safetensors_header(path: str | os.PathLike) -> dict[str, Any]:
    """The parsed header of a safetensors file (see the module docstring); ``ValueError`` naming the file if
    it is unreadable, not safetensors, or truncated."""
    p = Path(path)
    try:
        size = p.stat().st_size
        with open(p, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ValueError("shorter than a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER or 8 + n > size:
                raise ValueError(f"header length {n} does not fit the file size {size}")
            header = json.loads(fh.read(n))
    except OSError as e:
        raise ValueError(f"{str(p)!r} cannot be read: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{str(p)!r} is not a readable safetensors file ({e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{str(p)!r} is not a readable safetensors file (header is not a JSON object)")
    data = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise ValueError(f"{str(p)!r} is not a readable safetensors file (bad entry for tensor {name[:80]!r})") from None
        if not 0 <= begin <= end <= data:
            raise ValueError(f"{str(p)!r} is truncated or corrupt: tensor {name[:80]!r} needs bytes {begin}..{end} "
                             f"of the data section but the file holds {data}")
    return header
