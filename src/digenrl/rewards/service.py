"""The reward service: any registered reward (or weighted sum) behind HTTP on loopback, with request batching.

``digenrl reward-serve --reward NAME [--option key=value ...] | --config run.yaml`` serves ``POST /score``
(wire format in ``rewards.wire``) and ``GET /health``. Reward models (CLIP, PickScore, ...) then live in one
process (or on one GPU) shared by every generator worker, which call it through ``RemoteReward``. Concurrent
requests are batched (``rewards.batching.RequestBatcher``; ``/health`` reports the last ``batch_sizes``); the
response carries the total and the per-reward breakdown (``parts``) of a weighted sum.

Errors (422 for what the reward raises on a request alone, 503 only for what a retry can fix: ``TRANSIENT``),
the hardening (body cap 413, whole-request deadline 408, bounded connections 503, 400 for a malformed request)
and the token (401): docs/rewards.md, "The reward service". The deadline covers the whole request from its first
byte (or the connection's previous answer), not each read: a per-read timeout alone would let a client trickling
one byte a second hold its thread forever.
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import json
import os
import signal
import socket
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Sequence

from digenrl.rewards import wire
from digenrl.rewards.base import TRANSIENT  # 503: a retry can fix these; anything else 422
from digenrl.rewards.batching import RequestBatcher
from digenrl.rewards.client import read_token

DEFAULT_MAX_BODY = 256 * 2**20
DEFAULT_MAX_CONNECTIONS = 64


def _closing_answer(status: bytes, error: str) -> bytes:
    """A whole HTTP answer ``{"error": ...}`` that closes the connection, written on the socket directly."""
    body = json.dumps({"error": error}).encode()
    return b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (
        status, len(body), body)


_BUSY = _closing_answer(b"503 Service Unavailable", "busy: every connection slot is held; retry")


class _Handler(BaseHTTPRequestHandler):
    server: "RewardServer"

    def setup(self) -> None:
        self.timeout = self.server.read_timeout  # StreamRequestHandler applies it to every socket read
        self.reaped = False  # the whole-request deadline passed: the reaper answered 408 and shut the socket
        super().setup()

    def handle_one_request(self) -> None:
        self.server.arm(self)  # the whole request must arrive within read_timeout from here
        try:
            super().handle_one_request()
        finally:
            self.server.disarm(self)
        if self.reaped:
            self.close_connection = True

    def _received(self) -> bool:
        """The request is in (headers, and the body if any): stop its deadline; False if it already passed."""
        if not self.server.disarm(self):
            self.close_connection = True
            return False
        return True

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
        if not self._received():
            return
        if self.path.rstrip("/") != "/health":
            self._reply(404, {"error": f"unknown path {self.path[:100]!r}; use POST /score or GET /health"})
            return
        b = self.server.batcher
        self._reply(200, {"status": "ok", "reward": self.server.reward_name, "batch_sizes": list(b.batch_sizes)})

    def _fail(self, code: int, msg: str) -> None:
        """Answer ``{"error": msg}`` and close, unless the whole-request deadline passed (answered 408 already)."""
        if self._received():
            self._reply(code, {"error": msg}, close=True)

    def _read_body(self) -> bytes | None:
        """The request body, or None after answering the error (400 / 408 / 411 / 413)."""
        raw = self.headers.get("Content-Length")
        if raw is None:
            return self._fail(411, "bad request: Content-Length is required")
        try:
            length = int(raw)
        except ValueError:
            length = -1
        if length < 0:
            return self._fail(400, f"bad request: Content-Length {raw[:40]!r} is not a byte count")
        if length > self.server.max_body_bytes:
            self._read(length)  # read and drop it (no memory), so the client sees the answer, not a reset
            return self._fail(413, f"bad request: body of {length} bytes exceeds the limit of "
                                   f"{self.server.max_body_bytes} (send uint8 images or smaller batches)")
        chunks, left = self._read(length, keep=True)
        if left is None:
            return self._fail(408, f"bad request: body not received within {self.server.read_timeout:g}s")
        if left:
            return self._fail(400, f"bad request: body ended {left} bytes short of Content-Length")
        return b"".join(chunks) if self._received() else None

    def _read(self, left: int, keep: bool = False) -> tuple[list[bytes], int | None]:
        """Read ``left`` bytes in 1 MiB chunks (kept only if ``keep``): (chunks, bytes short) or (.., None) on a
        timeout / socket error."""
        chunks = []
        try:
            while left > 0:
                chunk = self.rfile.read(min(left, 1 << 20))
                if not chunk:
                    break
                if keep:
                    chunks.append(chunk)
                left -= len(chunk)
        except (TimeoutError, OSError):
            return chunks, None
        return chunks, left

    def _authorised(self) -> bool:
        token = self.server.token
        if not token:
            return True
        got = self.headers.get("Authorization", "")
        return hmac.compare_digest(got.encode(), f"Bearer {token}".encode())

    def do_POST(self) -> None:  # noqa: N802
        if self.reaped:
            return
        if self.path.rstrip("/") != "/score":
            return self._fail(404, f"unknown path {self.path[:100]!r}; use POST /score")
        if not self._authorised():
            return self._fail(401, "unauthorised: missing or wrong bearer token")
        body = self._read_body() if not self.reaped else None
        if body is None:
            return
        try:
            images, prompts = wire.decode_request(json.loads(body))
        except Exception as e:  # anything raised while decoding is the request's fault
            msg = str(e) if isinstance(e, wire.WireError) else f"invalid JSON or payload ({type(e).__name__})"
            self._reply(400, {"error": f"bad request: {msg[:300]}"})
            return
        fut = self.server.batcher.submit(images, prompts)
        name = self.server.reward_name
        try:
            total, parts = fut.result(timeout=self.server.request_timeout)
        except FutureTimeout:
            code, error = 503, f"reward {name} did not answer within {self.server.request_timeout:g}s"
        except TRANSIENT as e:  # a retry can fix it (the client retries 5xx)
            code, error = 503, f"reward {name} failed: {repr(e)[:300]}"
        except Exception as e:  # raised on this request alone: scoring it again fails alike (not retried)
            code, error = 422, f"reward {name} rejected the request: {repr(e)[:300]}"
        else:
            return self._reply(200, {"scores": total.tolist(), "parts": {k: v.tolist() for k, v in parts.items()}})
        self._reply(code, {"error": error})


class RewardServer(ThreadingHTTPServer):
    """An in-process reward service (``start()`` / ``stop()``, or a ``with`` block); ``port=0`` picks a free port."""

    daemon_threads = True

    def __init__(self, fn, host: str = "127.0.0.1", port: int = 0, max_batch: int = 32, max_wait: float = 0.01,
                 request_timeout: float = 600.0, read_timeout: float = 30.0, max_body_bytes: int = DEFAULT_MAX_BODY,
                 token: str | None = None, max_connections: int = DEFAULT_MAX_CONNECTIONS):  # fmt: skip
        if read_timeout <= 0 or request_timeout <= 0 or max_body_bytes < 1 or max_connections < 1:
            raise ValueError("reward service: need read_timeout > 0, request_timeout > 0, max_body_bytes >= 1, "
                             "max_connections >= 1")
        super().__init__((host, port), _Handler)  # binds first: a taken port leaves no thread behind
        self.batcher, self.reward_name = RequestBatcher(fn, max_batch, max_wait), getattr(fn, "name", type(fn).__name__)
        self.request_timeout, self.read_timeout = float(request_timeout), float(read_timeout)
        self.max_body_bytes, self.token, self.max_connections = int(max_body_bytes), token or None, int(max_connections)
        self.open_connections = 0
        self._lock = threading.Lock()
        self._armed: dict[_Handler, float] = {}  # handler -> deadline of the request it is reading
        self._closing = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="reward-reaper", daemon=True)
        self._reaper.start()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "RewardServer":
        threading.Thread(target=self.serve_forever, name="reward-http", daemon=True).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self.batcher.close()

    def __enter__(self) -> "RewardServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---- bounded connections ----
    def process_request(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        with self._lock:
            busy = self.open_connections >= self.max_connections
            if not busy:
                self.open_connections += 1
        if busy:  # answered at once on the accepting thread (no thread started)
            try:
                request.sendall(_BUSY)
                request.shutdown(socket.SHUT_WR)
                request.settimeout(0.05)
                request.recv(65536)  # what the client sent already, so close() sends no reset over the answer
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self.open_connections -= 1

    def handle_error(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        import sys

        if isinstance(sys.exc_info()[1], OSError):
            return  # a socket the reaper shut, or a client gone: nothing to report
        super().handle_error(request, client_address)

    # ---- whole-request deadline ----
    def arm(self, h: "_Handler") -> None:
        with self._lock:
            self._armed[h] = time.monotonic() + self.read_timeout

    def disarm(self, h: "_Handler") -> bool:
        """Stop ``h``'s deadline; False if the reaper got there first (it answered 408)."""
        with self._lock:
            return self._armed.pop(h, None) is not None and not h.reaped

    def _reap(self) -> None:
        tick = min(0.1, self.read_timeout / 4)
        late_answer = _closing_answer(b"408 Request Timeout", f"bad request: the request did not arrive within "
                                                              f"{self.read_timeout:g}s")  # fmt: skip
        while not self._closing.wait(tick):
            now = time.monotonic()
            with self._lock:
                late = [h for h, t in self._armed.items() if t <= now]
                for h in late:
                    del self._armed[h]
                    h.reaped = True
            for h in late:
                try:
                    h.connection.settimeout(1.0)
                    h.connection.sendall(late_answer)
                except OSError:
                    pass
                try:
                    h.connection.shutdown(socket.SHUT_RDWR)  # the handler's blocked read returns; its thread ends
                except OSError:
                    pass

    def server_close(self) -> None:
        self._closing.set()
        super().server_close()


def _parse_options(items: Sequence[str]) -> dict[str, Any]:
    from digenrl.config import safe_yaml_load

    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--option {item!r} must look like key=value")
        k, v = item.split("=", 1)
        out[k] = safe_yaml_load(v) if v else ""
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
    src.add_argument("--config", help="a digenrl config file: serve its reward table (weighted sum)")
    ap.add_argument("--option", action="append", default=[], help="key=value option of --reward (repeatable)")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    ap.add_argument("--port", type=int, default=8900, help="TCP port (default 8900)")
    ap.add_argument("--max-batch", type=int, default=32, help="samples scored together at most (default 32)")
    ap.add_argument("--max-wait-ms", type=float, default=10.0,
                    help="ms a request waits for others to batch with (default 10)")
    ap.add_argument("--max-body-mb", type=float, default=DEFAULT_MAX_BODY / 2**20, help="request body cap (larger bodies are drained and answered 413)")
    ap.add_argument("--read-timeout", type=float, default=30.0,
                    help="seconds a whole request may take to arrive (408 when exceeded)")
    ap.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                    help="connections served at once (one more is answered 503 at once)")
    tok = ap.add_mutually_exclusive_group()
    tok.add_argument("--token-file", default=None,
                     help="file holding the shared token required as 'Authorization: Bearer ...'")
    tok.add_argument("--token", default=None,
                     help="the token itself (visible in ps; prefer --token-file or $DIGENRL_REWARD_TOKEN)")
    ap.add_argument("--allow-unauthenticated", action="store_true",
                    help="serve beyond loopback without a token (not recommended)")
    args = ap.parse_args(argv)
    token = args.token or os.environ.get("DIGENRL_REWARD_TOKEN") or None
    try:
        token = read_token(args.token_file, "--token-file") if args.token_file is not None else token
    except ValueError as e:
        print(f"error: {e}", flush=True)
        return 2
    if not token and not args.allow_unauthenticated and not _is_loopback(args.host):
        print(f"error: --host {args.host} serves beyond loopback: set --token-file (or DIGENRL_REWARD_TOKEN) and the "
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
                              token=token, max_connections=args.max_connections)  # fmt: skip
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
