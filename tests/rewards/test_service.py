"""Reward service on loopback: exact scores, server-side batching, retries and clear errors."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
import torch

from digenrl.rewards.client import RemoteReward, RewardServiceError
from digenrl.rewards.registry import build_reward, build_weighted
from digenrl.rewards.service import RewardServer
from digenrl.rollout.records import Prompt


class SlowMean:
    """mean pixel value + uid; sleeps so that concurrent requests pile up in the queue."""

    name = "slow_mean"

    def __init__(self, delay=0.15):
        self.delay, self.calls = delay, []

    def __call__(self, images, prompts):
        self.calls.append(images.shape[0])
        time.sleep(self.delay)
        return images.mean(dim=(1, 2, 3)) + torch.tensor([float(p.uid) for p in prompts])


def batch(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, 16, 16, generator=g), [Prompt(seed * 10 + i, f"p{i}") for i in range(n)]


def test_scores_equal_direct_call_with_parts():
    fn = build_weighted({"jpeg_compressibility": {"weight": 2.0}, "jpeg_incompressibility": {"weight": 1.0}})
    x, prompts = batch(3, 0)
    with RewardServer(fn) as server:
        assert server.url.startswith("http://127.0.0.1:")
        total, parts = RemoteReward(server.url).score(x, prompts)
        uint8 = RemoteReward(server.url, wire_dtype="uint8")(x, prompts)
    exp_total, exp_parts = fn.score(x, prompts)
    torch.testing.assert_close(total, exp_total)
    torch.testing.assert_close(parts["jpeg_incompressibility"], exp_parts["jpeg_incompressibility"])
    assert uint8.shape == (3,)  # quantised transport: same encoder input up to rounding
    torch.testing.assert_close(uint8, exp_total, atol=0.02 * exp_total.abs().max().item(), rtol=0)


def test_concurrent_requests_are_batched():
    fn = SlowMean()
    results = {}
    with RewardServer(fn, max_batch=8, max_wait=0.3) as server:
        client = RemoteReward(server.url)
        first = threading.Thread(target=lambda: results.setdefault(99, client(*batch(2, 99))))
        first.start()  # occupies the scorer for `delay` seconds while the others queue up
        time.sleep(0.05)
        threads = [threading.Thread(target=lambda s=s: results.setdefault(s, client(*batch(2, s)))) for s in range(6)]
        for t in threads:
            t.start()
        for t in threads + [first]:
            t.join()
        health = json.loads(urllib.request.urlopen(server.url + "/health").read())
    sizes = health["batch_sizes"]
    assert sizes == fn.calls and sum(sizes) == 14
    assert max(sizes) <= 8 and max(sizes) >= 4  # several 2-sample requests shared one forward
    assert len(sizes) < 7
    for s, got in results.items():
        torch.testing.assert_close(got, SlowMean(0)(*batch(2, s)))


def test_service_down_gives_clear_error_after_retries():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    url = f"http://127.0.0.1:{port}"
    client = RemoteReward(url, retries=2, backoff=0.01, timeout=1.0)
    with pytest.raises(RewardServiceError, match=rf"{url}.*3 attempts"):
        client(*batch(1, 0))


def test_every_server_a_reward_calls_is_reported_down_in_one_message():
    """The reward service, a GenEval detector and a VLM judge that nobody answers: one message (``post_retrying``)
    naming the config key of the address, the URL, the attempts and the last error, each in its reward's error."""
    import numpy as np

    from digenrl.rewards.geneval import RemoteDetector
    from digenrl.rewards.vlm_judge import VlmJudge, VlmJudgeError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"  # closed again: nothing listens there
    img = np.zeros((8, 8, 3), np.uint8)
    calls = [(RewardServiceError, "reward remote: url", f"{url}/score", r"retry_window 600s; ",
              lambda: RemoteReward(url, retries=1, backoff=0.0, timeout=1.0)(*batch(1, 0))),
             (RuntimeError, "reward geneval: detector_url", f"{url}/detect", "",
              lambda: RemoteDetector(f"{url}/detect", timeout=1.0, retries=1, backoff=0.0)([img])),
             (VlmJudgeError, "reward vlm_judge: base_url", f"{url}/v1/chat/completions", r"retries 1; ",
              lambda: VlmJudge(f"{url}/v1", "m", retries=1, backoff=0.0, timeout=1.0).ask(img, "p"))]
    for error, setting, where, limit, call in calls:
        with pytest.raises(error) as got:
            call()
        assert re.fullmatch(rf"{setting}: {re.escape(where)} unavailable after 2 attempts over \d+\.\ds "
                            rf"\({limit}last error: .*Connection refused.*\)", str(got.value)), str(got.value)


def test_every_server_a_reward_calls_is_reported_refusing_in_one_message():
    """The same three servers answering HTTP 422: one message naming the config key, the URL, the code and the
    server's answer, raised at once (no retry), each in its reward's error."""
    import http.server

    import numpy as np

    from digenrl.rewards.geneval import RemoteDetector
    from digenrl.rewards.vlm_judge import VlmJudge, VlmJudgeError

    posts = []

    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            posts.append(self.path)
            self.send_response(422)
            self.end_headers()
            self.wfile.write(b"images must be 3 x H x W")

        def log_message(self, *a):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    img = np.zeros((8, 8, 3), np.uint8)
    calls = [(RewardServiceError, "reward remote: url", f"{url}/score",
              lambda: RemoteReward(url, retries=3, backoff=0.0, timeout=5.0)(*batch(1, 0))),
             (RuntimeError, "reward geneval: detector_url", f"{url}/detect",
              lambda: RemoteDetector(f"{url}/detect", timeout=5.0, retries=3, backoff=0.0)([img])),
             (VlmJudgeError, "reward vlm_judge: base_url", f"{url}/v1/chat/completions",
              lambda: VlmJudge(f"{url}/v1", "m", retries=3, backoff=0.0, timeout=5.0).ask(img, "p"))]
    try:
        for error, setting, where, call in calls:
            posts.clear()
            with pytest.raises(error) as got:
                call()
            assert str(got.value) == f"{setting}: {where} refused the request (422): images must be 3 x H x W"
            assert len(posts) == 1  # a 4xx is not retried
    finally:
        server.shutdown()


def test_failing_reward_and_bad_requests():
    class Boom:
        name = "boom"

        def __call__(self, images, prompts):
            raise RuntimeError("kaput")

    with RewardServer(Boom()) as server:
        with pytest.raises(RewardServiceError, match="kaput"):
            RemoteReward(server.url, retries=1, backoff=0.0)(*batch(1, 0))
        req = urllib.request.Request(server.url + "/score", data=b'{"images": {"dtype": "int64"}}')
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req)
        assert err.value.code == 400
    with pytest.raises(ValueError, match="url"):
        build_reward("remote")


def test_reward_serve_main_subprocess():
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    code = "import sys; from digenrl.rewards.service import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, "--reward", "jpeg_incompressibility", "--port", "0"],
                            stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        line = proc.stdout.readline()
        assert "serving reward" in line, line
        url = line.split(" at ")[1].split()[0]
        x, prompts = batch(2, 3)
        torch.testing.assert_close(RemoteReward(url)(x, prompts), build_reward("jpeg_incompressibility")(x, prompts))
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    bad = subprocess.run([sys.executable, "-c", code, "--reward", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "reward.nope: unknown reward" in bad.stdout
