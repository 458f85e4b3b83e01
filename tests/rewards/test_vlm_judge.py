"""VLM judge against a small OpenAI-compatible chat server on loopback written here: request format, score
parsing and normalisation, concurrency, retries of transient failures, no retry of 4xx, timeouts."""

from __future__ import annotations

import base64
import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch

from digenrl.rewards.registry import RewardConfigError, build_reward, validate_reward_spec
from digenrl.rewards.vlm_judge import VlmJudgeError
from digenrl.rollout.records import Prompt


class Judge(BaseHTTPRequestHandler):
    """Grades brightness: 'Final Score: 1 + 4 * mean pixel'. Prompt words steer the failure modes."""

    def log_message(self, *a):
        pass

    def do_POST(self):  # noqa: N802
        st = self.server.state
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with st["lock"]:
            st["inflight"] += 1
            st["max_inflight"] = max(st["max_inflight"], st["inflight"])
            st["requests"].append(req)
        try:
            code, obj = self._answer(req)
        finally:  # counted out before answering, so the client's next request cannot overlap this one
            with st["lock"]:
                st["inflight"] -= 1
        self._send(code, obj)

    def _answer(self, req):
        st = self.server.state
        assert self.path == "/v1/chat/completions" and req["model"] == "judge-7b" and req["temperature"] == 0
        assert self.headers.get("Authorization") == "Bearer k"
        image_part, text_part = req["messages"][0]["content"]
        caption = text_part["text"].rsplit("[", 1)[1].rstrip("]")
        from PIL import Image

        png = base64.b64decode(image_part["image_url"]["url"].split(",", 1)[1])
        img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.float64) / 255.0
        time.sleep(0.1)
        if caption == "flaky" and st["flaky"] < 2:
            st["flaky"] += 1
            return 503, {"error": "warming up"}
        if caption == "forbidden":
            return 403, {"error": "no"}
        if caption == "hang":
            time.sleep(1.5)
        content = "No score here." if caption == "mumble" else f"Looks fine. **Final Score:** {1 + 4 * img.mean():.3f}"
        return 200, {"choices": [{"message": {"role": "assistant", "content": content}}], "size": img.shape}

    def _send(self, code, obj):
        body = json.dumps(obj).encode()
        try:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up ("hang": its timeout)
            pass


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Judge)
    srv.daemon_threads = True
    srv.state = {"lock": threading.Lock(), "inflight": 0, "max_inflight": 0, "requests": [], "flaky": 0}
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv, f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def flat(values):
    return torch.stack([torch.full((3, 8, 8), v) for v in values])


def judge(url, **kw):
    return build_reward("vlm_judge", base_url=url, model="judge-7b", api_key="k", image_size=16, backoff=0.05, **kw)


def test_scores_parse_normalise_and_run_concurrently(server):
    srv, url = server
    levels = [0.0, 0.25, 0.5, 0.75, 1.0, 0.5]
    prompts = [Prompt(i, f"caption {i}") for i in range(5)] + [Prompt(5, "mumble")]
    r, info = judge(url, concurrency=3).score(flat(levels), prompts)
    expected = (1 + 4 * torch.tensor(levels[:5])) / 5  # Flow-GRPO: grade / 5
    torch.testing.assert_close(r[:5], expected, atol=2e-3, rtol=0)
    assert r[5] == 0.0 and info["parsed"].tolist() == [1, 1, 1, 1, 1, 0]
    st = srv.state
    assert 1 < st["max_inflight"] <= 3  # concurrent, bounded by `concurrency`
    texts = [q["messages"][0]["content"][1]["text"] for q in st["requests"]]
    assert any("[caption 3]" in t for t in texts) and all("Final Score:" in t for t in texts)
    with pytest.raises(ValueError, match="no score"):
        judge(url, on_parse_failure="error")(flat([0.5]), [Prompt(0, "mumble")])


def test_a_video_sends_its_middle_frame(server):
    _, url = server
    video = torch.stack([flat([0.0, 1.0]), flat([1.0, 0.0]), flat([0.0, 1.0])], dim=2)  # [B=2, C, F=3, H, W]
    r = judge(url)(video, [Prompt(0, "a"), Prompt(1, "b")])
    torch.testing.assert_close(r, torch.tensor([1.0, 0.2]), atol=2e-3, rtol=0)  # frame 1: brightness 1, then 0


def test_retries_transient_errors_but_not_4xx_and_times_out(server):
    srv, url = server
    r = judge(url, retries=3)(flat([1.0]), [Prompt(0, "flaky")])
    assert srv.state["flaky"] == 2 and r.item() == pytest.approx(1.0, abs=2e-3)  # two 503s, then answered
    n = len(srv.state["requests"])
    with pytest.raises(VlmJudgeError, match="refused the request \\(403\\)"):
        judge(url, retries=3)(flat([1.0]), [Prompt(0, "forbidden")])
    assert len(srv.state["requests"]) == n + 1  # not retried
    with pytest.raises(VlmJudgeError, match="unavailable after 2 attempts"):
        judge(url, retries=1, timeout=0.5)(flat([1.0]), [Prompt(0, "hang")])


def test_options_are_validated():
    base = {"base_url": "http://127.0.0.1:1/v1", "model": "m"}
    with pytest.raises(RewardConfigError, match="reward.vlm_judge.concurrenccy: unknown option"):
        validate_reward_spec({"vlm_judge": {**base, "concurrenccy": 2}})
    with pytest.raises(RewardConfigError, match="reward.vlm_judge.model: required option is missing"):
        validate_reward_spec({"vlm_judge": {"base_url": "http://x"}})
    with pytest.raises(ValueError, match="placeholder"):
        build_reward("vlm_judge", **base, prompt_template="no placeholder")
