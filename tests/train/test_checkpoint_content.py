"""Checkpoints are checked by content, not header only (issue 22, item 6): every checkpoint carries the sha256
of its data section; a flipped bit there or a tensor overwritten with NaN is refused on load naming the file,
and a resume falls back to the older checkpoint as for a truncated one. A checkpoint written before the hash
existed still loads (a warning says it is not verified), but a non-finite weight in it is refused."""

from __future__ import annotations

import json
import logging
import struct

import pytest
import torch

from digenrl.config import load_config
from digenrl.train import checkpoint as ckpt


@pytest.fixture()
def saved(tmp_path):
    from digenrl.train.context import build_context

    cfg = load_config(None, [f"run_dir={tmp_path}", "train.ema_decay=0.5"])
    ctx = build_context(cfg)
    for step in (1, 2):
        ckpt.write_checkpoint(tmp_path, step, ckpt.pack_train_state(ctx, step=step), keep=2)
    return tmp_path, [p for _, p in ckpt.list_checkpoints(tmp_path)]


def _layout(path):
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return data, n, json.loads(data[8 : 8 + n])


def _model_tensor(header):
    name = next(k for k in header if k.startswith("model/") and header[k]["dtype"] == "F32")
    return name, header[name]["data_offsets"]


def test_every_checkpoint_records_its_content_hash(saved):
    _, (old, new) = saved
    import hashlib

    data, n, header = _layout(new)
    assert header["__metadata__"][ckpt.HASH_KEY] == hashlib.sha256(data[8 + n :]).hexdigest()
    state = ckpt.read_train_state(new)
    assert ckpt.unpack(new.read_bytes()).step == state.step == 2


def test_a_flipped_bit_in_the_data_section_is_refused_and_resume_falls_back(saved):
    run_dir, (old, new) = saved
    data, n, header = _layout(new)
    _, (begin, end) = _model_tensor(header)
    pos = 8 + n + (begin + end) // 2
    buf = bytearray(data)
    buf[pos] ^= 0x01  # one bit of one weight: the header and sizes still check out
    new.write_bytes(bytes(buf))
    with pytest.raises(ValueError, match=r"content .*sha256"):
        ckpt.read_train_state(new)
    with pytest.raises(ValueError, match=r"content .*sha256"):
        ckpt.unpack(bytes(buf))
    assert ckpt.latest_checkpoint(run_dir) == old


def test_a_nan_filled_tensor_is_refused_and_resume_falls_back(saved):
    run_dir, (old, new) = saved
    data, n, header = _layout(new)
    _, (begin, end) = _model_tensor(header)
    nan = struct.pack("<f", float("nan")) * ((end - begin) // 4)
    new.write_bytes(data[: 8 + n + begin] + nan + data[8 + n + end :])
    with pytest.raises(ValueError, match=str(new.name)):
        ckpt.read_train_state(new)
    assert ckpt.latest_checkpoint(run_dir) == old


def _strip_hash(path):
    """The same checkpoint as a version before content hashes wrote it."""
    data, n, header = _layout(path)
    del header["__metadata__"][ckpt.HASH_KEY]
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head + data[8 + n :])


def test_a_checkpoint_without_hash_loads_with_a_warning(saved, caplog):
    run_dir, (old, new) = saved
    _strip_hash(new)
    with caplog.at_level(logging.WARNING, logger="digenrl.train.checkpoint"):
        assert ckpt.read_train_state(new).step == 2
        assert ckpt.latest_checkpoint(run_dir) == new
    assert "no content hash" in caplog.text


def test_a_checkpoint_without_hash_holding_nan_is_refused(saved):
    run_dir, (old, new) = saved
    data, n, header = _layout(new)
    _, (begin, end) = _model_tensor(header)
    new.write_bytes(data[: 8 + n + begin] + struct.pack("<f", float("nan")) * ((end - begin) // 4) + data[8 + n + end :])
    _strip_hash(new)
    with pytest.raises(ValueError, match="not finite"):
        ckpt.read_train_state(new)
    assert ckpt.latest_checkpoint(run_dir) == old


@pytest.fixture()
def sharded_saved(tmp_path, monkeypatch):
    """Two checkpoints of a sharded run written by ``pack_sharded_state`` (one process: the shard write is a
    plain ``torch.distributed.checkpoint`` save of a small state, the barriers no-ops)."""
    from types import SimpleNamespace

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from digenrl.train import sharding
    from digenrl.train.sharded_checkpoint import pack_sharded_state

    monkeypatch.setattr(dist, "barrier", lambda **kw: None)
    monkeypatch.setattr(sharding, "save_sharded",
                        lambda ctx, path: dcp.save({"w": torch.randn(256)}, checkpoint_id=str(path), no_dist=True))
    tx = SimpleNamespace(open=False, process_group=None, version=0, precision=None)
    ctx = SimpleNamespace(transaction=tx, cfg=load_config(None, [f"run_dir={tmp_path}"]), ema=None)
    for step in (1, 2):
        tx.version = step
        data = pack_sharded_state(ctx, tmp_path, step=step, counters={}, rank=0)
        ckpt.write_checkpoint(tmp_path, step, data, keep=2)
    return tmp_path, [p for _, p in ckpt.list_checkpoints(tmp_path)]


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_flipped_bit_in_a_shard_file_is_refused_and_resume_falls_back(sharded_saved):
    run_dir, (old, new) = sharded_saved
    state = ckpt.read_train_state(new)
    d = new.parent / state.sharded
    assert sorted(state.shards) == sorted(str(f.relative_to(d)) for f in d.rglob("*") if f.is_file())
    assert ckpt.verify_checkpoint(new) is None and ckpt.latest_checkpoint(run_dir) == new
    shard = max((f for f in d.iterdir() if f.name != ".metadata"), key=lambda f: f.stat().st_size)
    buf = bytearray(shard.read_bytes())
    buf[len(buf) // 2] ^= 0x01  # one bit of the data: the file's size and the metadata file still check out
    shard.write_bytes(bytes(buf))
    why = ckpt.verify_checkpoint(new)
    assert why is not None and shard.name in why and "sha256" in why
    assert ckpt.latest_checkpoint(run_dir) == old  # the resume falls back to the older checkpoint
    (old.parent / ckpt.read_train_state(old).sharded / shard.name).unlink()
    assert "missing" in ckpt.verify_checkpoint(old) and ckpt.latest_checkpoint(run_dir) is None
