"""Resumable checkpoints: everything a run carries from one committed step to the next.

A step is a transaction and every trajectory's noise is a function of (seed, step, prompt, generation) (I5),
so the state after commit k is exactly:

* the trainable weights (LoRA adapters only under LoRA; the frozen base comes from ``model.path``),
* the optimizer state (AdamW moments and step counts, param groups),
* the EMA shadow (``train.ema_decay``), the step / policy-version counters,
* DiffusionNFT's old copy and its optimizer-step count (``train.nft_old_policy=soft``, ``train.nft_old``),
* fp16's dynamic loss scale and its counters (``train.mixed_precision=fp16``; an older checkpoint without it
  resumes at ``tuning.loss_scale_init``),
* torch's global RNG state (CPU and CUDA; nothing in the step math draws from it today, but dropout would),
* run counters (wall time, samples, eval rewards) so the summary of a resumed run covers the whole run,
* the config, and the hash of its math-relevant part (``resume_config.math_config``).

Restoring it and running steps k+1.. reproduces the uninterrupted run bitwise on CPU (I6). Nothing else is
carried across steps: prompts, timestep plans and noise are functions of (seed, step); advantages are
normalised inside a step's groups (``std_mode=global`` inside the step's batch).

A sharded run (``train.sharding: fsdp``) keeps its tensors in ``step_<k:08d>.dcp/`` and the file holds only the
rest (``sharded`` names the directory): see ``train.sharded_checkpoint``.

Layout: ``run_dir/checkpoints/step_<k:08d>.safetensors`` (one file per checkpoint, written atomically by
``digenrl.safe_files``; the newest ``runtime.keep_checkpoints`` are kept). Tensors are named ``model/<param>``,
``ema/<param>``, ``nft_old/<param>``, ``optim/<i>/<key>`` (i = index of the parameter in the optimizer) and ``rng/...``; the rest is
JSON in the ``digenrl_train_state`` metadata entry. ``run_dir/checkpoint.safetensors`` stays the final trained
(EMA) weights that ``eval`` / ``sample`` load.

Content check (docs/reliability.md): the ``digenrl_sha256`` metadata entry holds the sha256 of the file's data
section (every tensor byte; it does not depend on the metadata, so the hash is taken before it is added). Every
load (``read_train_state``, ``unpack``, ``verify_checkpoint``) verifies it and that every weight, EMA and
optimizer tensor is finite (``ValueError`` naming the file); a sharded run's shard files too (``check_shards``).

For the Ray runtime: trainer rank 0 calls ``pack_train_state`` (bytes), the controller writes them with
``write_checkpoint`` where the run lives; on resume the controller finds ``latest_checkpoint`` and every
trainer rank calls ``restore_train_state(ctx, read_train_state(path))`` (EMA only where ``ctx.ema`` is set).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import struct
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load, load_file, save

from digenrl.safe_files import atomic_write_bytes, remove_orphans, safetensors_header
from digenrl.schedule import step_number
from digenrl.train.nft_old import old_of

from .resume_config import config_hash

CHECKPOINT_DIR = "checkpoints"
META_KEY = "digenrl_train_state"
HASH_KEY = "digenrl_sha256"  # sha256 hex of the data section (see the module docstring)
FORMAT = 1
_NAME = re.compile(r"^step_(\d{8})\.safetensors$")


@dataclass
class TrainState:
    """One resumable checkpoint in memory (see the module docstring)."""

    step: int  # committed steps
    version: int  # policy version after them
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]  # torch optimizer state_dict
    ema: dict[str, torch.Tensor] | None
    rng: dict[str, torch.Tensor]
    config: dict[str, Any]
    counters: dict[str, Any] = field(default_factory=dict)
    ema_updates: int = 0  # optimizer steps the EMA has seen (its warm-up and update interval depend on it)
    sharded: str | None = None  # sharded run: the ``torch.distributed.checkpoint`` directory holding the tensors
    shards: dict[str, list] | None = None  # sharded run: {file in that directory: [size, sha256 hex]}
    nft_old: dict[str, torch.Tensor] | None = None  # DiffusionNFT's old copy (train.nft_old_policy=soft)
    nft_old_commits: int = 0  # optimizer steps it has seen (its decay d_n depends on them)
    loss_scale: dict[str, Any] | None = None  # fp16: the dynamic loss scale (``Precision.state_dict``)


logger = logging.getLogger(__name__)


# ---- packing ---------------------------------------------------------------------------------------------
def check_closed(ctx) -> None:
    """A checkpoint is taken between steps: ``RuntimeError`` inside an open transaction."""
    if ctx.transaction.open:
        raise RuntimeError(f"checkpoint inside the open transaction of step {step_number(ctx.transaction.step)}")


def run_state(ctx, *, step: int, counters: dict[str, Any] | None, **tensors) -> TrainState:
    """A ``TrainState`` of ``ctx``'s counters (version, EMA updates, fp16's loss scale S and its counters, so that
    a resumed run goes on with the S it had), config and run ``counters``, with the ``tensors`` fields given."""
    p = ctx.transaction.precision
    return TrainState(step=step, version=ctx.transaction.version, config=ctx.cfg.model_dump(mode="json"),
                      counters=dict(counters or {}), ema_updates=ctx.ema.num_updates if ctx.ema is not None else 0,
                      loss_scale=None if p is None else p.state_dict(), **tensors)


def capture(ctx, *, step: int, counters: dict[str, Any] | None = None) -> TrainState:
    """The ``TrainState`` of a ``RunContext`` (between steps: no open transaction)."""
    check_closed(ctx)
    rng = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            rng[f"torch_cuda_{i}"] = s
    old = old_of(ctx.policy)  # DiffusionNFT's old copy (train.nft_old_policy=soft)
    return run_state(ctx, step=step, counters=counters, model=dict(ctx.policy.trainable_state_dict()),
                     optimizer=ctx.optimizer.state_dict(), ema=dict(ctx.ema.shadow) if ctx.ema is not None else None,
                     rng=rng, **({} if old is None else dict(zip(("nft_old", "nft_old_commits"), old.state()))))


def restore_counters(ctx, state: TrainState) -> None:
    """``state``'s version, EMA update count, fp16 loss scale (a checkpoint without one: ``tuning.loss_scale_init``)
    and CPU RNG into ``ctx``."""
    if ctx.ema is not None:
        ctx.ema.num_updates = state.ema_updates
    if ctx.transaction.precision is not None and state.loss_scale is not None:
        ctx.transaction.precision.load_state_dict(state.loss_scale)
    ctx.transaction.version = state.version
    torch.set_rng_state(state.rng["torch_cpu"])


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu").contiguous().clone()


def pack(state: TrainState) -> bytes:
    """Serialise a ``TrainState`` to safetensors bytes."""
    parts = {"model": state.model, "ema": state.ema or {}, "nft_old": state.nft_old or {}, "rng": state.rng}
    tensors = {f"{part}/{k}": _cpu(v) for part, d in parts.items() for k, v in d.items()}
    opt_plain: dict[str, dict[str, Any]] = {}
    for idx, entry in state.optimizer["state"].items():
        for key, val in entry.items():
            if isinstance(val, torch.Tensor):
                tensors[f"optim/{idx}/{key}"] = _cpu(val)
            else:
                opt_plain.setdefault(str(idx), {})[key] = val
    meta = {"format": FORMAT, "step": state.step, "version": state.version, "config": state.config,
            "config_hash": config_hash(state.config), "counters": state.counters,
            "param_groups": state.optimizer["param_groups"], "optim_plain": opt_plain,
            "has_ema": state.ema is not None, "ema_updates": state.ema_updates, "model_keys": list(state.model),
            "sharded": state.sharded, "shard_sha256": state.shards, "has_nft_old": state.nft_old is not None,
            "nft_old_commits": state.nft_old_commits, "loss_scale": state.loss_scale}
    return _with_content_hash(save(tensors, metadata={META_KEY: json.dumps(meta, default=float)}))


def _with_content_hash(data: bytes) -> bytes:
    """``data`` (safetensors bytes) with the sha256 of its data section added to the header's metadata."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    body = memoryview(data)[8 + n :]
    header.setdefault("__metadata__", {})[HASH_KEY] = hashlib.sha256(body).hexdigest()
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # safetensors pads the header to 8 bytes
    return struct.pack("<Q", len(head)) + head + body


def _check_hash(metadata: dict, digest: str, where: str) -> None:
    """``ValueError`` unless ``digest`` is the recorded content hash (none recorded: a warning)."""
    want = metadata.get(HASH_KEY)
    if want is None:
        logger.warning("%s: checkpoint has no content hash (written by an older version); its content is not "
                       "verified", where)
    elif want != digest:
        raise ValueError(f"{where!r} is corrupt: its content does not match the sha256 recorded when it was "
                         f"written ({digest[:12]}... != {want[:12]}...)")


def _check_file_hash(p: Path, metadata: dict) -> None:
    with open(p, "rb") as fh:
        offset = 8 + struct.unpack("<Q", fh.read(8))[0]
    _check_hash(metadata, _file_digest(p, offset) if HASH_KEY in metadata else "", str(p))


def _file_digest(path: Path, offset: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        fh.seek(offset)
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _check_finite(tensors: dict[str, torch.Tensor], where: str) -> None:
    for name, t in tensors.items():
        if name.startswith(("model/", "ema/", "nft_old/", "optim/")) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"{where!r} is corrupt: tensor {name[:80]!r} holds values that are not finite")


def pack_train_state(ctx, *, step: int, counters: dict[str, Any] | None = None) -> bytes:
    """``pack(capture(ctx, ...))``: what a trainer rank hands to the controller."""
    return pack(capture(ctx, step=step, counters=counters))


def read_train_state(path: str | Path) -> TrainState:
    """Load a checkpoint file (``ValueError`` naming it if it is not a complete train-state checkpoint)."""
    p = Path(path)
    metadata = safetensors_header(p).get("__metadata__") or {}
    _check_file_hash(p, metadata)
    return _parse(metadata, load_file(str(p)), str(p))


def unpack(data: bytes) -> TrainState:
    """``TrainState`` from checkpoint bytes (a controller reads the file and sends the bytes to remote ranks)."""
    n = int.from_bytes(data[:8], "little")  # safetensors: u64 header length, JSON header (see safe_files)
    metadata = json.loads(data[8 : 8 + n]).get("__metadata__") or {}
    _check_hash(metadata, hashlib.sha256(memoryview(data)[8 + n :]).hexdigest(), "<bytes>")
    return _parse(metadata, load(data), "<bytes>")


def _parse(metadata: dict, tensors: dict[str, torch.Tensor], where: str) -> TrainState:
    raw = metadata.get(META_KEY)
    if raw is None:
        raise ValueError(f"{where!r} is not a resumable checkpoint (no {META_KEY} metadata)")
    meta = json.loads(raw)
    if meta.get("format") != FORMAT:
        raise ValueError(f"{where!r}: checkpoint format {meta.get('format')} (this version reads {FORMAT})")
    _check_finite(tensors, where)
    parts: dict[str, dict[str, Any]] = {"model": {}, "ema": {}, "rng": {}, "nft_old": {}, "optim": {}}
    for k, v in tensors.items():
        part, name = k.split("/", 1)
        parts[part][name] = v
    model, rng, old = parts["model"], parts["rng"], parts["nft_old"]
    ema = parts["ema"] if meta["has_ema"] else None
    opt_state: dict[int, dict[str, Any]] = {}
    for k, v in parts["optim"].items():
        idx, key = k.split("/", 1)
        opt_state.setdefault(int(idx), {})[key] = v
    for idx, entry in meta["optim_plain"].items():
        opt_state.setdefault(int(idx), {}).update(entry)
    optimizer = {"state": dict(sorted(opt_state.items())), "param_groups": meta["param_groups"]}
    return TrainState(step=meta["step"], version=meta["version"], model={k: model[k] for k in meta["model_keys"]},
                      optimizer=optimizer, ema=ema, rng=rng, config=meta["config"], counters=meta["counters"],
                      ema_updates=int(meta.get("ema_updates", 0)), sharded=meta.get("sharded"),
                      shards=meta.get("shard_sha256"), nft_old=old if meta.get("has_nft_old") else None,
                      nft_old_commits=int(meta.get("nft_old_commits", 0)), loss_scale=meta.get("loss_scale"))


def _like(saved: Any, live: Any) -> Any:
    """JSON turned tuples into lists; give hyperparameters back the live group's types."""
    return tuple(saved) if isinstance(live, tuple) and isinstance(saved, list) else saved


def restore_train_state(ctx, state: TrainState) -> None:
    """Load ``state`` into a freshly built ``RunContext`` (weights, optimizer, EMA, version, RNG)."""
    live = dict(ctx.policy.trainable_state_dict())
    if list(live) != list(state.model):
        extra, missing = sorted(set(state.model) - set(live)), sorted(set(live) - set(state.model))
        raise ValueError(f"checkpoint of step {state.step} does not match the model's trainable parameters "
                         f"(unknown: {extra[:3]}, missing: {missing[:3]}); was model.lora changed?")
    ctx.policy.load_trainable_state_dict(state.model)
    groups = [{k: _like(v, cur.get(k)) for k, v in saved.items()}
              for saved, cur in zip(state.optimizer["param_groups"], ctx.optimizer.state_dict()["param_groups"])]
    ctx.optimizer.load_state_dict({"state": state.optimizer["state"], "param_groups": groups})
    if ctx.ema is not None:
        if state.ema is None:
            raise ValueError("checkpoint has no EMA but train.ema_decay is set")
        with torch.no_grad():
            for k, v in state.ema.items():
                ctx.ema.shadow[k].copy_(v)
    old = old_of(ctx.policy)  # DiffusionNFT's old copy (train.nft_old_policy=soft)
    if old is not None:
        if state.nft_old is None:
            raise ValueError("checkpoint has no DiffusionNFT old policy but train.nft_old_policy is soft")
        old.load(state.nft_old, state.nft_old_commits)
    restore_counters(ctx, state)
    cuda = [state.rng[k] for k in sorted(state.rng) if k.startswith("torch_cuda_")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])


# ---- files -----------------------------------------------------------------------------------------------
def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of the checkpoint files in ``run_dir``, oldest first (complete or not)."""
    d = checkpoint_dir(run_dir)
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name))] if d.is_dir() else []
    return sorted(found)


_VERIFIED: dict[tuple[str, int, int], str | None] = {}  # (path, size, mtime_ns) -> None (good) or why not


def verify_checkpoint(path: str | Path) -> str | None:
    """Why the checkpoint file ``path`` cannot be resumed (header, sizes, content hash, finite tensors), or
    None if it can. Remembered per (path, size, mtime) within the process."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as e:
        return f"{str(p)!r} cannot be read: {e.strerror or e}"
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns, _shard_stats(p))
    if key not in _VERIFIED:
        try:
            metadata = safetensors_header(p).get("__metadata__") or {}
            if META_KEY not in metadata:
                raise ValueError(f"{str(p)!r} is not a resumable checkpoint (no {META_KEY} metadata)")
            _check_file_hash(p, metadata)
            meta = json.loads(metadata[META_KEY])
            if meta.get("sharded"):
                check_shards(p.parent / meta["sharded"], meta.get("shard_sha256"), str(p))
            with safe_open(str(p), framework="pt") as f:  # one tensor at a time
                for name in f.keys():
                    _check_finite({name: f.get_tensor(name)}, str(p))
            _VERIFIED[key] = None
        except (ValueError, OSError, RuntimeError) as e:  # (safetensors raises its own error type for bad bytes)
            _VERIFIED[key] = str(e)
        except Exception as e:  # noqa: BLE001  safetensors_rust.SafetensorError
            _VERIFIED[key] = f"{str(p)!r} is not a readable safetensors file ({e})"
    return _VERIFIED[key]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest checkpoint whose header, sizes and content check out (``verify_checkpoint``); a damaged newer
    one is skipped with a warning naming it."""
    for _, p in reversed(list_checkpoints(run_dir)):
        why = verify_checkpoint(p)
        if why is None:
            return p
        logger.warning("skipping checkpoint %s: %s", p.name, why)
    return None


def write_checkpoint(run_dir: str | Path, step: int, data: bytes, *, keep: int) -> Path:
    """Write packed state ``data`` atomically as the checkpoint of ``step``; keep the newest ``keep``."""
    d = checkpoint_dir(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    remove_orphans(d)
    path = atomic_write_bytes(d / f"step_{step:08d}.safetensors", data)
    old = list_checkpoints(run_dir)
    for k, p in old[: max(0, len(old) - max(1, keep))]:
        p.unlink(missing_ok=True)
        shutil.rmtree(d / sharded_dir_name(k), ignore_errors=True)  # its shards, if it was a sharded run's
    return path


def sharded_dir_name(step: int) -> str:
    """The directory of a sharded run's checkpoint of ``step`` (next to its metadata file)."""
    return f"step_{step:08d}.dcp"


def _shard_files(d: Path) -> list[Path]:
    return sorted(f for f in d.rglob("*") if f.is_file())


def _shard_stats(p: Path) -> tuple:
    """(name, size, mtime) of the files of the shard directory next to checkpoint file ``p`` (none: ())."""
    m = _NAME.match(p.name)
    d = p.parent / sharded_dir_name(int(m.group(1))) if m else None
    if d is None or not d.is_dir():
        return ()
    return tuple((str(f.relative_to(d)), f.stat().st_size, f.stat().st_mtime_ns) for f in _shard_files(d))


def shard_manifest(d: str | Path) -> dict[str, list]:
    """{file of the shard directory ``d``, relative: [size, sha256 hex]}: what a sharded checkpoint records."""
    d = Path(d)
    return {str(f.relative_to(d)): [f.stat().st_size, _file_digest(f, 0)] for f in _shard_files(d)}


def check_shards(d: str | Path, manifest: dict[str, list] | None, where: str, digests: bool = True) -> None:
    """``ValueError`` naming the file unless the shard directory ``d`` holds every file of ``manifest`` with
    its recorded size and sha256 (``manifest`` None: a checkpoint from before shard hashes; warned, not verified;
    ``digests=False``: the sizes only)."""
    d = Path(d)
    if not (d / ".metadata").is_file():
        raise ValueError(f"{where!r}: its shard directory {str(d)!r} is missing or incomplete")
    if manifest is None:
        logger.warning("%s: sharded checkpoint has no shard hashes (written by an older version); its shards are "
                       "not verified", where)
        return
    for name, (size, digest) in sorted(manifest.items()):
        f = d / name
        if not f.is_file():
            raise ValueError(f"{where!r}: shard file {str(f)!r} is missing")
        if f.stat().st_size != size:
            raise ValueError(f"{where!r}: shard file {str(f)!r} is corrupt: {f.stat().st_size} bytes, "
                             f"{size} when it was written")
        if digests and (got := _file_digest(f, 0)) != digest:
            raise ValueError(f"{where!r}: shard file {str(f)!r} is corrupt: its content does not match the sha256 "
                             f"recorded when it was written ({got[:12]}... != {digest[:12]}...)")


def due(step: int, every: int) -> bool:
    """Is a periodic checkpoint due after ``step`` commits (``runtime.checkpoint_every``; 0 = never)?"""
    return every > 0 and step % every == 0
