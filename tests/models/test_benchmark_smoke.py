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


def test_fast_generator_tiny(tmp_path, capsys):
    """benchmarks/fast_generator.py at tiny sizes (dynamo without code generation for the compiled variants): the
    results file's structure, and the tables it prints (--table) and writes into a doc's block (--doc)."""
    mod = load_script("benchmarks/fast_generator.py")
    out = tmp_path / "fast.json"
    assert mod.main(["--tiny", "--repeats", "2", "--step-calls", "1", "--compile-backend", "eager",
                     "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["meta"]["repeats"] == 2 and report["public_gpu"]["xdit_flux1_dev_1024px_28steps_h100"]["eager_s"] == 6.71
    assert set(report["models"]) == {"demo", "flux"}
    assert set(report["models"]["demo"]["variants"]) == {"eager", "bf16", "compile", "all"}  # no LoRA: no merge
    assert set(report["models"]["flux"]["variants"]) == {"eager", "merge", "bf16", "compile", "all"}
    flux = report["models"]["flux"]
    assert flux["variants"]["all"]["options"] == {"merge_lora": True, "dtype": "bfloat16", "compile": "default"}
    assert 0 < flux["config"]["adapter_flop_share_at_flux1_width"] < flux["config"]["adapter_flop_share"]
    for res in report["models"].values():
        eager = res["variants"]["eager"]
        assert eager["step_ratio"] == eager["fragment_ratio"] == 1.0
        for v in res["variants"].values():
            for key in ("step_s", "fragment_s", "loadavg_step", "loadavg_fragment"):
                assert len(v[key]) == 2 and all(x >= 0 for x in v[key]), key
            assert v["step_ratio"] > 0 and v["fragment_ratio"] > 0 and v["denoise_steps_per_s"] > 0
            assert v["mismatch"]["cells"] > 0 and v["mismatch"]["max_abs_logp"] >= 0
            assert (v["compile_backend"] == "eager") == (v["options"]["compile"] != "none")
        assert res["variants"]["bf16"]["mismatch"]["max_abs_logp"] > res["variants"]["eager"]["mismatch"]["max_abs_logp"]
    capsys.readouterr()
    assert mod.main(["--table", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "**demo**" in text and "**flux**" in text and "| merge |" in text
    doc = tmp_path / "doc.md"
    doc.write_text(f"intro\n{mod.BEGIN}\nold\n{mod.END}\nrest\n")
    mod.DOC = doc
    assert mod.main(["--table", "--check", "--out", str(out)]) == 1  # stale block
    assert mod.main(["--table", "--doc", "--out", str(out)]) == 0
    assert mod.main(["--table", "--check", "--out", str(out)]) == 0
    assert doc.read_text().startswith("intro\n") and "| merge |" in doc.read_text() and doc.read_text().endswith("rest\n")
