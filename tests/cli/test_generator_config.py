"""The ``generator`` section and the behaviour log-prob options refuse what cannot work: exit 2 from the CLI, one
message naming the key, nothing written (docs/fast_generator.md)."""

from __future__ import annotations

import pytest

from digenrl.cli import main

BAD = {
    "colocated has no pool": (["generator.compile=default"], "generator.compile: runtime.mode=colocated has no generator pool"),
    "colocated dtype": (["generator.dtype=bfloat16"], "generator.dtype: runtime.mode=colocated has no generator pool"),
    "merge without lora": (["runtime.mode=gap", "generator.merge_lora=true"], "generator.merge_lora: needs LoRA"),
    "unknown compile mode": (["runtime.mode=gap", "generator.compile=fast"], "generator.compile"),
    "unknown dtype": (["runtime.mode=gap", "generator.dtype=int8"], "generator.dtype"),
    "tis without recompute": (["train.tis_cap=2"], "train.tis_cap: the truncated importance weight"),
    "tis cap below 1": (["train.old_logprob=recompute", "train.tis_cap=0.5"], "train.tis_cap"),
    "recompute with nft": (["train.old_logprob=recompute", "train.algorithm=nft"], "train.old_logprob: recompute is not"),
    "recompute with guard": (["train.old_logprob=recompute", "train.algorithm=grpo_guard"],
                             "train.old_logprob: recompute is not"),
    "unknown old_logprob": (["train.old_logprob=trainer"], "train.old_logprob"),
    "compile with a sequence-parallel generator": (
        ["runtime.mode=gap", "model.kind=wan", "runtime.generator_sequence_parallel=2", "generator.compile=default"],
        "generator.compile: default is not supported with runtime.generator_sequence_parallel"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_refused_with_the_key_named(case, tmp_path, capsys):
    overrides, needle = BAD[case]
    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", "log.progress=false", *overrides]) == 2
    assert needle in capsys.readouterr().err
    assert not run.exists()


def test_good_combinations_pass():
    from digenrl.config import load_config

    cfg = load_config(None, ["runtime.mode=gap_tsp_tag", "generator.compile=reduce-overhead",
                             "generator.dtype=bfloat16", "train.old_logprob=recompute", "train.tis_cap=2"])
    assert cfg.generator.compile == "reduce-overhead" and cfg.train.tis_cap == 2.0
    cfg = load_config(None, ["runtime.mode=naive", "model.kind=flux", "model.lora.enabled=true",
                             "generator.merge_lora=true"])
    assert cfg.generator.merge_lora

