"""Reward service, round 3 (issue 22, item 8): a request the reward cannot score (wrong image shape, bad meta
values) is answered 4xx, so the client raises at once instead of retrying for its 600 s window; only what a
retry can fix (an unreachable dependency, out of memory) is 5xx. Connection threads are bounded (beyond the cap
a connection is answered 503 at once) and a whole request must arrive within ``read_timeout`` (a slow client
trickling bytes is dropped, not held). The token can come from a file or the environment instead of argv."""

from __future__ import annotations

import http.client
import socket
import threading
import time

import pytest
import torch

from digenrl.rewards.client import RemoteReward, RewardServiceError
from digenrl.rewards.registry import build_weighted
from digenrl.rewards.service import RewardServer, main
from digenrl.rollout.records import Prompt


def digits_request(shape=(1, 1, 8, 16), meta=None):
    return torch.rand(*shape), [Prompt(0, "x", meta if meta is not None else {"left": 1, "right": 2})]


@pytest.fixture(scope="module")
def digits_server():
    with RewardServer(build_weighted({"digits": {"weight": 1.0}})) as s:
        yield s


@pytest.mark.parametrize("case", [
    {"shape": (1, 3, 8, 16)},           # RGB for a one-channel reward
    {"shape": (1, 1, 2, 8, 16)},        # a video for an image reward
    {"shape": (1, 1, 4, 4)},            # too small
    {"meta": {"left": 99, "right": 1}},  # a class the classifier does not have
    {"meta": {"left": "seven", "right": 1}},
    {"meta": {"left": None, "right": 1}},
])  # fmt: skip
def test_what_the_reward_cannot_score_is_4xx_and_not_retried(digits_server, case):
    client = RemoteReward(digits_server.url, retry_window=10, backoff=0.05)
    t0 = time.monotonic()
    with pytest.raises(RewardServiceError, match=r"refused the request \(422\)"):
        client(*digits_request(**case))
    assert time.monotonic() - t0 < 10  # (a 5xx is retried for the whole window)
    assert client(*digits_request()).shape == (1,)  # the service still serves good requests


def test_transient_failures_stay_5xx_and_retried():
    class Flaky:
        name = "flaky"
        calls = 0

        def __call__(self, images, prompts):
            Flaky.calls += 1
            if Flaky.calls < 3:
                raise ConnectionError("judge endpoint unreachable")
            return images.mean(dim=(1, 2, 3))

    with RewardServer(Flaky()) as srv:
        out = RemoteReward(srv.url, retry_window=30, backoff=0.01)(*digits_request())
    assert out.shape == (1,) and Flaky.calls == 3


def _slow_loris(url: str, stop: threading.Event, closed: list, i: int) -> None:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    s.settimeout(0.2)
    try:
        s.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\n")
        while not stop.is_set():
            try:
                s.sendall(b"X")  # one byte of a header line every 0.2 s: never a whole request
                if s.recv(4096) == b"":
                    break
            except TimeoutError:
                continue
            except OSError:
                break
            else:
                break  # the server answered (408) instead of waiting
        closed[i] = not stop.is_set()
    finally:
        s.close()


def _status(url: str) -> int:
    host, port = url.removeprefix("http://").split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=20)
    try:
        c.request("GET", "/health")
        return c.getresponse().status
    finally:
        c.close()


def test_slow_clients_are_bounded_and_dropped():
    n = 4
    with RewardServer(build_weighted({"jpeg_compressibility": {"weight": 1.0}}), read_timeout=2.0,
                      max_connections=n) as srv:  # fmt: skip
        stop, closed = threading.Event(), [False] * n
        threads = [threading.Thread(target=_slow_loris, args=(srv.url, stop, closed, i), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        try:
            deadline = time.monotonic() + 1.5
            while srv.open_connections < n and time.monotonic() < deadline:
                time.sleep(0.02)
            assert srv.open_connections == n  # every slot held: one more connection is answered 503 at once
            assert _status(srv.url) == 503
            for t in threads:
                t.join(timeout=20)  # each trickles bytes, which a per-read timeout would never end
            assert all(closed), closed
            assert _status(srv.url) == 200  # the slots are free again
        finally:
            stop.set()


def test_token_from_file_or_environment(tmp_path, monkeypatch, capsys):
    from digenrl.rewards import service

    seen = {}

    class Started(Exception):
        pass

    def fake_start(self):
        seen["token"] = self.token
        self.server_close()
        self.batcher.close()
        raise Started

    monkeypatch.setattr(service.RewardServer, "start", fake_start)
    monkeypatch.setattr(service.signal, "signal", lambda *a: None)
    monkeypatch.delenv("DIGENRL_REWARD_TOKEN", raising=False)
    f = tmp_path / "token"
    f.write_text("s3cret\n")
    f.chmod(0o600)
    args = ["--reward", "jpeg_compressibility", "--host", "127.0.0.1", "--port", "0"]
    with pytest.raises(Started):
        main([*args, "--token-file", str(f)])
    assert seen["token"] == "s3cret"
    monkeypatch.setenv("DIGENRL_REWARD_TOKEN", "fromenv")
    with pytest.raises(Started):
        main(args)
    assert seen["token"] == "fromenv"
    assert main([*args, "--token-file", str(tmp_path / "missing")]) == 2
    assert "--token-file" in capsys.readouterr().out
    (tmp_path / "empty").write_text("\n")
    assert main([*args, "--token-file", str(tmp_path / "empty")]) == 2


def test_client_token_from_a_file_stays_out_of_the_config(tmp_path, monkeypatch):
    from digenrl.rewards.registry import validate_reward_spec

    monkeypatch.delenv("DIGENRL_REWARD_TOKEN", raising=False)
    f = tmp_path / "token"
    f.write_text("s3cret\n")
    with RewardServer(build_weighted({"jpeg_compressibility": {"weight": 1.0}}), token="s3cret") as srv:
        spec = {"remote": {"url": srv.url, "weight": 1.0, "token_file": str(f)}}
        validate_reward_spec(spec)
        assert build_weighted(spec)(*digits_request((1, 3, 8, 8))).shape == (1,)
    with pytest.raises(ValueError, match="token_file"):
        validate_reward_spec({"remote": {"url": "http://127.0.0.1:1", "weight": 1.0, "token_file": str(tmp_path / "no")}})
