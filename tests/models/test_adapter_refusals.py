"""``models.lora_files.read_adapter`` refuses, naming ``model.lora_path`` and the file, each adapter its module
docstring lists as unusable (DoRA, rsLoRA, per-module rank / alpha patterns, ``modules_to_save``, modules of
different ranks, a config whose ``r`` its tensors contradict, a pickled ``.bin``, a broken config) and reads
the plain ones it accepts. The files are written here by hand, as PEFT and diffusers lay them out; only their
headers and configs are read, so no model is built."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from digenrl.models.lora_files import AdapterError, read_adapter

MODULE = "transformer_blocks.0.attn.to_q"


def _peft(tmp_path, config: dict | str | None, ranks=(4,), name="adapter_model.safetensors"):
    """A PEFT-style directory: ``base_model.model.<module>.lora_{A,B}.weight`` per rank, and its config."""
    d = tmp_path / "peft"
    d.mkdir()
    tensors = {}
    for i, r in enumerate(ranks):
        m = f"base_model.model.transformer_blocks.{i}.attn.to_q"
        tensors[f"{m}.lora_A.weight"] = torch.zeros(r, 8)
        tensors[f"{m}.lora_B.weight"] = torch.zeros(8, r)
    save_file(tensors, str(d / name))
    if config is not None:
        (d / "adapter_config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return d


PLAIN = {"r": 4, "lora_alpha": 8, "target_modules": ["to_q"], "lora_dropout": 0.0}


@pytest.mark.parametrize("config, ranks, message", [
    ({**PLAIN, "use_dora": True}, (4,), "sets use_dora"),
    ({**PLAIN, "use_rslora": True}, (4,), "sets use_rslora"),
    ({**PLAIN, "rank_pattern": {"to_q": 8}}, (4,), "sets rank_pattern"),
    ({**PLAIN, "alpha_pattern": {"to_q": 16}}, (4,), "sets alpha_pattern"),
    ({**PLAIN, "modules_to_save": ["proj_out"]}, (4,), r"modules_to_save=\['proj_out'\]"),
    (PLAIN, (4, 8), r"different ranks \[4, 8\]"),
    ({**PLAIN, "r": 16}, (4,), "says r=16, its tensors have rank 4"),
    ("{not json", (4,), "adapter_config.json.* is not valid JSON"),
])  # fmt: skip
def test_unusable_peft_adapters_are_refused_naming_the_file(tmp_path, config, ranks, message):
    d = _peft(tmp_path, config, ranks)
    with pytest.raises(AdapterError, match=f"^model.lora_path: .*peft.*{message}"):
        read_adapter(d)


def test_a_plain_peft_adapter_reads_its_settings(tmp_path):
    info = read_adapter(_peft(tmp_path, PLAIN))
    assert (info.fmt, info.rank, info.alpha, info.dropout, info.targets) == ("peft", 4, 8.0, 0.0, ["to_q"])
    assert set(info.keys.values()) == {f"{MODULE}.lora_A.weight", f"{MODULE}.lora_B.weight"}


def test_diffusers_adapters_read_their_metadata_or_default_alpha_to_rank(tmp_path):
    """diffusers' ``save_lora_weights`` keys (``transformer.<module>``), with and without the packed config."""
    tensors = {f"transformer.{MODULE}.lora_A.weight": torch.zeros(4, 8),
               f"transformer.{MODULE}.lora_B.weight": torch.zeros(8, 4)}
    bare = tmp_path / "bare" / "pytorch_lora_weights.safetensors"
    bare.parent.mkdir()
    save_file(tensors, str(bare))
    info = read_adapter(bare.parent)
    assert (info.fmt, info.rank, info.alpha, info.targets) == ("diffusers", 4, 4.0, [MODULE])
    meta = tmp_path / "meta" / "pytorch_lora_weights.safetensors"
    meta.parent.mkdir()
    packed = {"transformer.r": 4, "transformer.lora_alpha": 2, "transformer.use_dora": True}
    save_file(tensors, str(meta), metadata={"lora_adapter_metadata": json.dumps(packed)})
    with pytest.raises(AdapterError, match="pytorch_lora_weights.safetensors.* sets use_dora"):
        read_adapter(meta)
    save_file(tensors, str(meta), metadata={"lora_adapter_metadata": "{broken"})
    with pytest.raises(AdapterError, match="lora_adapter_metadata is not valid JSON"):
        read_adapter(meta)


def test_files_that_are_no_adapter_are_refused(tmp_path):
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    torch.save({}, pickled / "adapter_model.bin")
    with pytest.raises(AdapterError, match=r"holds no adapter_model.safetensors .*adapter_model.bin is a pickle"):
        read_adapter(pickled)
    with pytest.raises(AdapterError, match=r"model.lora_path: .*weights.pt.* is not a .safetensors adapter"):
        read_adapter(_touch(tmp_path / "weights.pt"))
    empty = tmp_path / "empty.safetensors"
    save_file({}, str(empty))
    with pytest.raises(AdapterError, match="empty.safetensors.* holds no tensors"):
        read_adapter(empty)
    only_b = tmp_path / "only_b.safetensors"
    save_file({f"transformer.{MODULE}.lora_B.weight": torch.zeros(8, 4)}, str(only_b))
    with pytest.raises(AdapterError, match="only_b.safetensors.* holds no lora_A tensors"):
        read_adapter(only_b)


def _touch(path):
    path.write_bytes(b"")
    return path
