"""``models.base.copy_tensors``: the checked copy of a state dict into parameters that ``model.checkpoint``,
``digenrl export`` / ``--checkpoint`` and ``model.lora_path`` use. Nothing is copied unless every check passes."""

from __future__ import annotations

import pytest
import torch

from digenrl.models.base import copy_tensors


class Refused(ValueError):
    pass


def _params():
    torch.manual_seed(0)
    return dict(torch.nn.Linear(3, 2).named_parameters())


@pytest.mark.parametrize("state, required, words", [
    ({"weight": torch.ones(2, 3), "extra": torch.ones(1)}, (), "extra"),  # a tensor the model does not have
    ({"weight": torch.ones(2, 3)}, ("weight", "bias"), "bias"),  # a required tensor missing
    ({"weight": torch.ones(3, 2), "bias": torch.ones(2)}, (), "(3, 2)"),  # a tensor of another shape
])  # fmt: skip
def test_a_state_that_does_not_fit_is_refused_and_nothing_is_copied(state, required, words):
    params = _params()
    before = {k: v.detach().clone() for k, v in params.items()}
    with pytest.raises(Refused, match=r"^ckpt: .*" + words.replace("(", r"\(").replace(")", r"\)")):
        copy_tensors(params, state, lambda problem: Refused(f"ckpt: {problem}"), required=required)
    assert all(torch.equal(params[k], before[k]) for k in params)


def test_a_fitting_state_is_copied_in_place():
    params = _params()
    weight = params["weight"]
    copy_tensors(params, {"weight": torch.full((2, 3), 2.0)}, Refused, required=("weight",))
    assert params["weight"] is weight and torch.equal(weight.detach(), torch.full((2, 3), 2.0))
