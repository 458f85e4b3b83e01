"""``rewards.local_weights.read_checkpoint``: the file forms a published reward checkpoint comes in (safetensors, a
zip or a legacy torch pickle, a training checkpoint's ``state_dict`` / ``model`` entry, DDP's ``module.``
prefix) read to the same plain state dict, and what is no checkpoint refused naming the reward and the file;
``layer_count`` refuses blocks with a gap."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from digenrl.rewards.local_weights import layer_count, read_checkpoint

STATE = {"visual.proj": torch.arange(6.0).reshape(2, 3), "logit_scale": torch.tensor(4.6)}


def _same(got: dict) -> bool:
    return got.keys() == STATE.keys() and all(torch.equal(got[k], STATE[k]) for k in STATE)


@pytest.mark.parametrize("form", ["safetensors", "zip", "legacy pickle", "state_dict entry", "model entry", "ddp"])
def test_every_file_form_reads_to_the_plain_state_dict(tmp_path, form):
    path = tmp_path / ("w.safetensors" if form == "safetensors" else "w.pt")
    if form == "safetensors":
        save_file(STATE, str(path))
    elif form == "legacy pickle":  # torch's pre-1.6 format: not a zip, so it cannot be memory-mapped
        torch.save(STATE, str(path), _use_new_zipfile_serialization=False)
    elif form == "state_dict entry":
        torch.save({"state_dict": STATE, "epoch": 3}, str(path))
    elif form == "model entry":
        torch.save({"model": STATE, "step": 10}, str(path))
    elif form == "ddp":
        torch.save({f"module.{k}": v for k, v in STATE.items()}, str(path))
    else:
        torch.save(STATE, str(path))
    assert _same(read_checkpoint(str(path), "hpsv2"))


def test_what_is_no_checkpoint_is_refused_naming_the_reward_and_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"reward hpsv2: checkpoint_path '.*nope.pt' does not exist"):
        read_checkpoint(str(tmp_path / "nope.pt"), "hpsv2")
    for name, obj in (("list.pt", [torch.zeros(1)]), ("mixed.pt", {"w": torch.zeros(1), "lr": 0.1})):
        torch.save(obj, str(tmp_path / name))
        with pytest.raises(ValueError, match=f"reward hpsv2: '.*{name}' holds no state dict of tensors"):
            read_checkpoint(str(tmp_path / name), "hpsv2")


def test_layer_count_refuses_a_gap():
    blocks = {f"visual.blocks.{i}.w": torch.zeros(1) for i in (0, 1, 2)}
    assert layer_count(blocks, "visual.blocks.") == 3
    del blocks["visual.blocks.1.w"]
    with pytest.raises(ValueError, match=r"blocks visual.blocks.N are not numbered 0..1: \[0, 2\]"):
        layer_count(blocks, "visual.blocks.")
