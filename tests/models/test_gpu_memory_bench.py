"""The GPU memory benchmark stays runnable: --tiny on CPU, every setting, allocation-counted peaks."""

import json

from script_loader import load_script


def test_gpu_memory_tiny(tmp_path):
    mod = load_script("benchmarks/gpu_memory.py")
    out = tmp_path / "mem.json"
    assert mod.main(["--tiny", "--out", str(out)]) == 0
    rows = {r["setting"]: r for r in json.loads(out.read_text())["rows"]}
    assert len(rows) == 8
    assert all(r["peak_gib"] > 0 and r["chunk_s"] > 0 for r in rows.values())
    # full fine-tuning holds grads and AdamW state for every weight: more than LoRA in the same precision
    assert rows["full-fp32"]["peak_gib"] > rows["lora-fp32"]["peak_gib"]
