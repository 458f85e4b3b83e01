"""The GPU throughput benchmark stays runnable: --tiny on CPU through the real sampler and trainer paths."""

import json

from script_loader import load_script


def test_gpu_throughput_tiny(tmp_path):
    mod = load_script("benchmarks/gpu_throughput.py")
    out = tmp_path / "bench.json"
    assert mod.main(["--tiny", "--repeats", "1", "--steps", "2", "--prompts", "1", "--generations", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["modes"]) == {"sample", "decode", "train", "step"}
    assert all(m["images_per_s"] > 0 for m in report["modes"].values())
    assert report["meta"]["trainable_params"] < report["meta"]["transformer_params"]  # LoRA-only trainables
    assert report["meta"]["trained_steps"] == 1  # int(2 x 0.99): Flow-GRPO leaves the last step (sigma' = 0) out
