"""Reward service hardening: every malformed request is answered 4xx (never a dropped connection), a bad
request batched with good ones fails alone, 4xx is not retried, a restart inside the client's retry window
loses nothing, the shared token, and the per-reward breakdown through a WeightedSum."""

from __future__ import annotations

import base64
import http.client
import json
import socket
import threading
import time
import urllib.request

import numpy as np
import pytest
import torch

from digenrl.rewards import wire
from digenrl.rewards.client import RemoteReward, RewardServiceError
from digenrl.rewards.registry import build_weighted
from digenrl.rewards.service import RewardServer, main
from digenrl.rollout.records import Prompt


class MeanReward:
    """mean pixel + uid; rejects prompts whose text is 'bad' (a deterministic input error)."""

    name = "mean"

    def __init__(self, delay=0.0):
        self.delay, self.calls = delay, []

    def __call__(self, images, prompts):
        self.calls.append(len(prompts))
        time.sleep(self.delay)
        if any(p.text == "bad" for p in prompts):
            raise ValueError("prompt 'bad' cannot be scored")
        return images.mean(dim=(1, 2, 3)) + torch.tensor([float(p.uid) for p in prompts])


def batch(n, seed, text="p"):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, 8, 8, generator=g), [Prompt(seed * 10 + i, text) for i in range(n)]


def raw_request(url, body: bytes | None, headers: dict, timeout=10.0, send_len=None):
    """Send a hand-made POST /score and return (status, json body); fails the test on a dropped connection."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        head = "POST /score HTTP/1.1\r\nHost: x\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        s.sendall(head.encode() + (body or b""))
        resp = http.client.HTTPResponse(s)
        resp.begin()
        return resp.status, json.loads(resp.read())


def good_body(n=1):
    x, prompts = batch(n, 0)
    return {"images": wire.encode_images(x), "prompts": wire.encode_prompts(prompts)}


def encoded(obj) -> bytes:
    return json.dumps(obj).encode()


def _with(**changes):
    body = good_body()
    for path, value in changes.items():
        node = body
        keys = path.split("__")
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return encoded(body)


nan_data = base64.b64encode(np.full(3 * 8 * 8, np.nan, dtype=np.float32).tobytes()).decode()
MALFORMED = {
    "invalid_json": (b"{not json", 400),
    "not_utf8": (b"\xff\xfe\x00garbage", 400),
    "json_list": (b"[1, 2, 3]", 400),
    "no_images": (encoded({"prompts": []}), 400),
    "images_is_string": (_with(images="abc"), 400),
    "bad_dtype": (_with(images__dtype="int64"), 400),
    "shape_3_dims": (_with(images__shape=[1, 3, 8]), 400),
    "shape_negative": (_with(images__shape=[-1, 3, 8, 8]), 400),
    "shape_mismatch": (_with(images__shape=[2, 3, 8, 8]), 400),
    "bad_base64": (_with(images__data="@@@@"), 400),
    "nan_pixels": (_with(images__data=nan_data), 400),
    "prompts_not_list": (_with(prompts="p"), 400),
    "prompt_not_object": (_with(prompts=["p"]), 400),
    "uid_not_int": (_with(prompts=[{"uid": "x", "text": "p"}]), 400),
    "count_mismatch": (_with(prompts=[]), 400),
}


@pytest.fixture(scope="module")
def server():
    with RewardServer(MeanReward(), max_body_bytes=100_000, read_timeout=0.5) as s:
        yield s


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_body_gets_400_with_message(server, case):
    body, code = MALFORMED[case]
    status, out = raw_request(server.url, body, {"Content-Length": len(body)})
    assert status == code and out["error"].startswith("bad request:"), (status, out)
    assert len(out["error"]) < 400


def test_malformed_framing_gets_4xx(server):
    body = encoded(good_body())
    assert raw_request(server.url, body, {})[0] == 411  # no Content-Length
    assert raw_request(server.url, body, {"Content-Length": "abc"})[0] == 400
    assert raw_request(server.url, body, {"Content-Length": "-5"})[0] == 400
    big = b"x" * 200_000
    status, out = raw_request(server.url, big, {"Content-Length": len(big)})
    assert status == 413 and "exceeds the limit" in out["error"]
    # a short body under a large Content-Length: answered by the read timeout (408), not left hanging
    status, out = raw_request(server.url, body[:10], {"Content-Length": 5000})
    assert status == 408
    ok = RemoteReward(server.url)(*batch(1, 0))  # the server still serves
    torch.testing.assert_close(ok, MeanReward()(*batch(1, 0)))


def test_bad_request_batched_with_good_fails_alone():
    fn = MeanReward()
    results = {}
    with RewardServer(fn, max_batch=6, max_wait=10.0) as srv:  # the batch closes when all 6 samples are in
        client = RemoteReward(srv.url, retry_window=0)

        def call(key, n, seed, text):
            try:
                results[key] = client(*batch(n, seed, text))
            except RewardServiceError as e:
                results[key] = e

        threads = [threading.Thread(target=call, args=(k, 2, s, t)) for k, s, t in [("a", 1, "p"), ("bad", 2, "bad"), ("b", 3, "p")]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        sizes = json.loads(urllib.request.urlopen(srv.url + "/health").read())["batch_sizes"]
    assert sizes == [6, 2, 2, 2]  # the three requests were scored as one batch first, then each alone
    torch.testing.assert_close(results["a"], MeanReward()(*batch(2, 1)))  # the good ones succeed
    torch.testing.assert_close(results["b"], MeanReward()(*batch(2, 3)))
    assert isinstance(results["bad"], RewardServiceError) and "(422)" in str(results["bad"])


def test_4xx_is_not_retried_and_5xx_is():
    class Boom:
        name = "boom"

        def __init__(self):
            self.calls = 0

        def __call__(self, images, prompts):
            self.calls += 1
            raise ConnectionError("kaput")  # a dependency down: transient (503), unlike an error on the input

    fn = MeanReward()
    with RewardServer(fn) as srv:
        with pytest.raises(RewardServiceError, match="refused the request \\(422\\)"):
            RemoteReward(srv.url, retry_window=30, backoff=0.01)(*batch(1, 0, "bad"))
    assert fn.calls == [1]  # one attempt only
    boom = Boom()
    with RewardServer(boom) as srv:
        with pytest.raises(RewardServiceError, match="kaput"):
            RemoteReward(srv.url, retry_window=0.5, backoff=0.05)(*batch(1, 0))
    assert boom.calls >= 3  # a server failure is transient: retried within the window


def test_restart_inside_retry_window_loses_nothing():
    fn = MeanReward()
    first = RewardServer(fn).start()
    port = first.server_address[1]
    client = RemoteReward(first.url, retry_window=60, backoff=0.05, backoff_max=0.2, timeout=5)
    x, prompts = batch(3, 4)
    torch.testing.assert_close(client(x, prompts), MeanReward()(x, prompts))
    first.stop()  # the service goes down ...
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("r", client(x, prompts)))
    t.start()
    time.sleep(1.0)
    assert t.is_alive() and "r" not in result  # ... the caller waits (the run pauses) ...
    assert fn.calls == [3]  # nothing was scored while the service was down
    second = RewardServer(fn, port=port).start()  # ... and the service comes back on the same port
    try:
        t.join(timeout=30)
        assert not t.is_alive()
        torch.testing.assert_close(result["r"], MeanReward()(x, prompts))
        assert fn.calls == [3, 3]  # the waiting request was scored once, by the restarted service
    finally:
        second.stop()


def test_token_required_when_set(monkeypatch):
    with RewardServer(MeanReward(), token="s3cret") as srv:
        with pytest.raises(RewardServiceError, match="\\(401\\)"):
            RemoteReward(srv.url, token_env="DIGENRL_TEST_NO_SUCH_ENV")(*batch(1, 0))
        with pytest.raises(RewardServiceError, match="\\(401\\)"):
            RemoteReward(srv.url, token="wrong")(*batch(1, 0))
        assert RemoteReward(srv.url, token="s3cret")(*batch(1, 0)).shape == (1,)
        monkeypatch.setenv("DIGENRL_REWARD_TOKEN", "s3cret")
        assert RemoteReward(srv.url)(*batch(1, 0)).shape == (1,)


def test_serving_beyond_loopback_needs_a_token(capsys, monkeypatch):
    monkeypatch.delenv("DIGENRL_REWARD_TOKEN", raising=False)
    assert main(["--reward", "jpeg_incompressibility", "--host", "0.0.0.0", "--port", "0"]) == 2
    assert "--token" in capsys.readouterr().out


def test_remote_breakdown_per_reward():
    served = build_weighted({"jpeg_compressibility": {"weight": 2.0}, "jpeg_incompressibility": {"weight": 1.0}})
    x, prompts = batch(2, 5)
    with RewardServer(served) as srv:
        local = build_weighted({"remote": {"url": srv.url, "weight": 0.5}})
        total, parts = local.score(x, prompts)
    exp_total, exp_parts = served.score(x, prompts)
    torch.testing.assert_close(total, 0.5 * exp_total)
    for name in ("jpeg_compressibility", "jpeg_incompressibility"):
        torch.testing.assert_close(parts[f"remote/{name}"], exp_parts[name])
