"""The reward service: any registered reward (or weighted sum) behind HTTP on loopback, with request batching.

``digenrl reward-serve --reward NAME [--option key=value ...] | --config run.yaml`` serves ``POST /score``
(wire format in ``rewards.wire``) and ``GET /health``. Reward models (CLIP, PickScore, ...) then live in one
process (or on one GPU) shared by every generator worker, which call it through ``RemoteReward``.

Batching: handler threads put requests in a queue; one scoring thread takes the oldest request, opens a batch
and keeps adding queued requests with the same image shape until the batch holds ``max_batch`` samples or
``max_wait`` seconds have passed since it opened; it scores the concatenated batch in one call and hands
each request its slice. A request larger than ``max_batch`` is scored alone. The sizes of the last batches
are reported by ``/health`` (``batch_sizes``). The response carries the total and the per-reward breakdown
(``parts``) of a weighted sum, so several rewards (each a model on this process's device) share one service.

Isolation: if a batch of several requests fails, each request is scored again alone, so one bad request fails
only itself. A reward that rejects its input (``ValueError``, ``KeyError``, ``TypeError``, e.g. a prompt
without the metadata the reward needs) answers 422; any other failure 500 (which clients retry).

Hardening: the body is capped (``max_body_bytes``; larger -> drained without keeping it, then 413), every socket read has a
timeout (``read_timeout``; a stalled or short body -> 408), and every malformed request (bad or missing
Content-Length, invalid JSON, a field off the wire format) is answered 400 with a short message -- the
connection is never dropped without a response. With ``token`` set, ``POST /score`` requires
``Authorization: Bearer <token>`` (401 otherwise); ``digenrl reward-serve`` refuses to bind beyond loopback
without a token unless ``--allow-unauthenticated`` is given.
"""

from __future__ import annotations

import argparse
import collections
import hmac
import ipaddress
import json
import os
import queue
import signal
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Sequence

import torch

DEFAULT_MAX_BODY = 256 * 2**20
INPUT_ERRORS = (ValueError, KeyError, TypeError)

from digenrl.rewards import wire
from digenrl.rollout.records import Prompt


@dataclass
class _Job:
    images: torch.Tensor
    prompts: list[Prompt]
    future: Future = field(default_factory=Future)


def score_with_parts(fn, images: torch.Tensor, prompts: Sequence[Prompt]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    if hasattr(fn, "score"):
        total, parts = fn.score(images, prompts)
    else:
        total = fn(images, prompts)
        parts = {getattr(fn, "name", "reward"): total}
    return total.float().cpu().reshape(-1), {k: v.float().cpu().reshape(-1) for k, v in parts.items()}


class RequestBatcher:
    """Groups concurrent scoring requests into batches (see the module docstring)."""

    def __init__(self, fn, max_batch: int = 32, max_wait: float = 0.01):
        if max_batch < 1 or max_wait < 0:
            raise ValueError(f"max_batch must be >= 1 and max_wait >= 0, got {max_batch}, {max_wait}")
        self.fn, self.max_batch, self.max_wait = fn, int(max_batch), float(max_wait)
        self.batch_sizes: collections.deque[int] = collections.deque(maxlen=1000)
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._carry: list[_Job] = []
        self._thread = threading.Thread(target=self._run, name="reward-batcher", daemon=True)
        self._thread.start()

    def submit(self, images: torch.Tensor, prompts: Sequence[Prompt]) -> Future:
        if images.shape[0] != len(prompts):
            raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
        job = _Job(images, list(prompts))
        self._queue.put(job)
        return job.future

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _next(self, timeout: float | None) -> _Job | None:
        if self._carry:
            return self._carry.pop(0)
        return self._queue.get(timeout=timeout) if timeout is None or timeout > 0 else self._queue.get_nowait()

    def _run(self) -> None:
        while True:
            first = self._next(None)
            if first is None:
                return
            batch, size = [first], first.images.shape[0]
            deadline = time.monotonic() + self.max_wait
            held: list[_Job] = []
            while size < self.max_batch:
                try:
                    job = self._next(deadline - time.monotonic())
                except queue.Empty:
                    break
                if job is None:
                    self._queue.put(None)
                    break
                n = job.images.shape[0]
                if job.images.shape[1:] != first.images.shape[1:] or size + n > self.max_batch:
                    held.append(job)
                    continue
                batch.append(job)
                size += n
            self._carry = held + self._carry
            self._score(batch, size)

    def _score(self, batch: list[_Job], size: int) -> None:
        self.batch_sizes.append(size)
        try:
            images = torch.cat([j.images for j in batch])
            total, parts = score_with_parts(self.fn, images, [p for j in batch for p in j.prompts])
            if total.shape[0] != size:
                raise RuntimeError(f"reward returned {total.shape[0]} scores for {size} samples")
        except Exception as e:
            if len(batch) == 1:
                batch[0].future.set_exception(e)
            else:  # isolate: score each request alone, so a bad one fails only itself
                for j in batch:
                    self._score([j], j.images.shape[0])
            return
        start = 0
        for j in batch:
            n = j.images.shape[0]
            j.future.set_result((total[start : start + n], {k: v[start : start + n] for k, v in parts.items()}))
            start += n


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"

    def setup(self) -> None:
        self.timeout = self.server.read_timeout  # StreamRequestHandler applies it to every socket read
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _reply(self, code: int, obj: dict[str, Any], close: bool = False) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        if self.path.rstrip("/") != "/health":
            self._reply(404, {"error": f"unknown path {self.path[:100]!r}; use POST /score or GET /health"})
            return
        b = self.server.batcher
        self._reply(200, {"status": "ok", "reward": self.server.reward_name, "batch_sizes": list(b.batch_sizes)})

    def _read_body(self) -> bytes | None:
        """The request body, or None after answering the error (400 / 408 / 411 / 413)."""
        raw = self.headers.get("Content-Length")
        if raw is None:
            self._reply(411, {"error": "bad request: Content-Length is required"}, close=True)
            return None
        try:
            length = int(raw)
        except ValueError:
            length = -1
        if length < 0:
            self._reply(400, {"error": f"bad request: Content-Length {raw[:40]!r} is not a byte count"}, close=True)
            return None
        if length > self.server.max_body_bytes:
            self._discard(length)  # read and drop it (no memory), so the client sees the answer, not a reset
            self._reply(413, {"error": f"bad request: body of {length} bytes exceeds the limit of "
                                       f"{self.server.max_body_bytes} (send uint8 images or smaller batches)"},
                        close=True)  # fmt: skip
            return None
        chunks, left = [], length
        try:
            while left > 0:
                chunk = self.rfile.read(min(left, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
        except (TimeoutError, OSError):
            self._reply(408, {"error": f"bad request: body not received within {self.server.read_timeout:g}s"},
                        close=True)  # fmt: skip
            return None
        if left:
            self._reply(400, {"error": f"bad request: body ended {left} bytes short of Content-Length"}, close=True)
            return None
        return b"".join(chunks)

    def _discard(self, length: int) -> None:
        try:
            while length > 0:
                chunk = self.rfile.read(min(length, 1 << 20))
                if not chunk:
                    return
                length -= len(chunk)
        except (TimeoutError, OSError):
            return

    def _authorised(self) -> bool:
        token = self.server.token
        if not token:
            return True
        got = self.headers.get("Authorization", "")
        return hmac.compare_digest(got.encode(), f"Bearer {token}".encode())

    def do_POST(self) -> None:  # noqa: N802
        if self.path.rstrip("/") != "/score":
            self._reply(404, {"error": f"unknown path {self.path[:100]!r}; use POST /score"}, close=True)
            return
        if not self._authorised():
            self._reply(401, {"error": "unauthorised: missing or wrong bearer token"}, close=True)
            return
        body = self._read_body()
        if body is None:
            return
        try:
            images, prompts = wire.decode_request(json.loads(body))
        except Exception as e:  # anything raised while decoding is the request's fault
            msg = str(e) if isinstance(e, wire.WireError) else f"invalid JSON or payload ({type(e).__name__})"
            self._reply(400, {"error": f"bad request: {msg[:300]}"})
            return
        fut = self.server.batcher.submit(images, prompts)
        try:
            total, parts = fut.result(timeout=self.server.request_timeout)
        except FutureTimeout:
            self._reply(503, {"error": f"reward {self.server.reward_name} did not answer within "
                                       f"{self.server.request_timeout:g}s"})  # fmt: skip
            return
        except INPUT_ERRORS as e:
            self._reply(422, {"error": f"reward {self.server.reward_name} rejected the request: {str(e)[:300]}"})
            return
        except Exception as e:
            self._reply(500, {"error": f"reward {self.server.reward_name} failed: {repr(e)[:300]}"})
            return
        self._reply(200, {"scores": total.tolist(), "parts": {k: v.tolist() for k, v in parts.items()}})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    batcher: RequestBatcher
    reward_name: str
    request_timeout: float
    read_timeout: float
    max_body_bytes: int
    token: str | None


class RewardServer:
    """An in-process reward service (``start()`` / ``stop()``); ``port=0`` picks a free port."""

    def __init__(self, fn, host: str = "127.0.0.1", port: int = 0, max_batch: int = 32, max_wait: float = 0.01,
                 request_timeout: float = 600.0, read_timeout: float = 30.0, max_body_bytes: int = DEFAULT_MAX_BODY,
                 token: str | None = None):  # fmt: skip
        if read_timeout <= 0 or request_timeout <= 0 or max_body_bytes < 1:
            raise ValueError("reward service: need read_timeout > 0, request_timeout > 0, max_body_bytes >= 1")
        self.httpd = _Server((host, port), _Handler)
        self.httpd.batcher = RequestBatcher(fn, max_batch, max_wait)
        self.httpd.reward_name = getattr(fn, "name", type(fn).__name__)
        self.httpd.request_timeout = request_timeout
        self.httpd.read_timeout = float(read_timeout)
        self.httpd.max_body_bytes = int(max_body_bytes)
        self.httpd.token = token or None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def batch_sizes(self) -> list[int]:
        return list(self.httpd.batcher.batch_sizes)

    def start(self) -> "RewardServer":
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="reward-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.httpd.batcher.close()

    def __enter__(self) -> "RewardServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _parse_options(items: Sequence[str]) -> dict[str, Any]:
    import yaml

    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--option {item!r} must look like key=value")
        k, v = item.split("=", 1)
        out[k] = yaml.safe_load(v) if v else ""
    return out


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    """``digenrl reward-serve``: serve a reward over HTTP until interrupted. Returns the exit code."""
    from digenrl.rewards.registry import build_weighted, reward_names

    ap = argparse.ArgumentParser(prog="digenrl reward-serve", description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--reward", help=f"registered reward name ({', '.join(reward_names())})")
    src.add_argument("--config", help="a digenrl config file: serve its `reward` table (weighted sum)")
    ap.add_argument("--option", action="append", default=[], help="key=value option of --reward (repeatable)")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    ap.add_argument("--port", type=int, default=8900, help="TCP port (default 8900)")
    ap.add_argument("--max-batch", type=int, default=32, help="samples scored together at most (default 32)")
    ap.add_argument("--max-wait-ms", type=float, default=10.0,
                    help="ms a request waits for others to batch with (default 10)")
    ap.add_argument("--max-body-mb", type=float, default=DEFAULT_MAX_BODY / 2**20, help="request body cap (larger bodies are drained and answered 413)")
    ap.add_argument("--read-timeout", type=float, default=30.0, help="seconds per socket read (408 when exceeded)")
    ap.add_argument("--token", default=None,
                    help="shared token required as 'Authorization: Bearer ...' (default: $DIGENRL_REWARD_TOKEN)")
    ap.add_argument("--allow-unauthenticated", action="store_true",
                    help="serve beyond loopback without a token (not recommended)")
    args = ap.parse_args(argv)
    token = args.token or os.environ.get("DIGENRL_REWARD_TOKEN") or None
    if not token and not args.allow_unauthenticated and not _is_loopback(args.host):
        print(f"error: --host {args.host} serves beyond loopback: set --token (or DIGENRL_REWARD_TOKEN) and the "
              "same token in reward.remote.token, or pass --allow-unauthenticated", flush=True)  # fmt: skip
        return 2
    try:
        if args.config:
            from digenrl.config import load_config

            spec = load_config(args.config).reward
        else:
            spec = {args.reward: _parse_options(args.option)}
        fn = build_weighted(spec)
        server = RewardServer(fn, args.host, args.port, args.max_batch, args.max_wait_ms / 1000.0,
                              read_timeout=args.read_timeout, max_body_bytes=int(args.max_body_mb * 2**20),
                              token=token)  # fmt: skip
    except (ValueError, OSError) as e:
        print(f"error: {e}", flush=True)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    print(f"serving reward {fn.name!r} at {server.url} (max batch {args.max_batch})", flush=True)
    stop.wait()
    server.stop()
    return 0
