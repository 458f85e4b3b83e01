"""The simulator's price of ``train.old_logprob=recompute`` (``sim.algorithms``): with R rounds per step, a share
(R - 1) / R of the cells adds one no-grad forward (its FLOPs, under FSDP its all-gather) and the snapshot's
exchanges, and every step copies the weights once; one round (or ``generator``) prices nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from digenrl.config import load_config
from digenrl.sim import presets
from digenrl.sim.algorithms import Algorithm, AlgorithmError
from digenrl.sim.from_config import config_algorithm
from digenrl.sim.roofline import RooflineCost


def _cost(algo, model="flux"):
    w = replace(presets.WORKLOADS[model], algorithm=algo)
    return RooflineCost(presets.model_preset(model), w, presets.testbed_preset("B"), 8, 24)


@pytest.mark.parametrize("M,E,share", [(1, 1, 0.0), (2, 1, 0.5), (2, 2, 0.75), (1, 3, 2 / 3)])
def test_config_maps_to_the_share_of_later_rounds(M, E, share):
    cfg = load_config(None, ["train.old_logprob=recompute", f"train.minibatches_per_step={M}",
                             f"train.inner_epochs={E}"])
    algo = config_algorithm(cfg, 5)
    assert algo.recompute_share == pytest.approx(share) and algo.recompute_rounds == M * E
    generator = load_config(None, [f"train.minibatches_per_step={M}", f"train.inner_epochs={E}"])
    assert config_algorithm(generator, 5).recompute_share == 0.0


def test_the_extra_forward_is_priced():
    plain, rec = _cost(Algorithm()), _cost(Algorithm(recompute_share=0.75, recompute_rounds=4))
    # (2 forwards + backward's weight gradient) per cell, plus q forwards
    assert rec.train_flops_per_cell() - plain.train_flops_per_cell() == pytest.approx(
        0.75 * plain.fwd_flops * plain.train_fps)
    assert rec._train_chunk(8, "trainer") > plain._train_chunk(8, "trainer")
    assert rec._optimizer(1, "trainer") > plain._optimizer(1, "trainer")  # the snapshot's copy, 8 / R bytes
    one = _cost(Algorithm(recompute_share=0.0, recompute_rounds=1))
    assert one.train_flops_per_cell() == plain.train_flops_per_cell()
    assert one._optimizer(1, "trainer") == plain._optimizer(1, "trainer")
    with pytest.raises(AlgorithmError):
        Algorithm(recompute_share=1.0)
