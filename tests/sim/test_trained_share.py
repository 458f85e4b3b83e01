"""Cells the trainers skip are not priced: ``train.best_of_n`` trains n of G generations and sample minibatches
1 / M of every round's grid (``Workload.trained_share``; the runtime drops the other cells before the forward)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from digenrl.config import load_config
from digenrl.sim.from_config import trained_share
from digenrl.sim.presets import MODELS, TESTBEDS, WORKLOADS, PresetError
from digenrl.sim.roofline import RooflineCost


def test_a_chunk_costs_the_cells_that_run():
    w = WORKLOADS["hunyuan_video"]
    third = RooflineCost(MODELS["hunyuan_video"], replace(w, trained_share=8 / 24), TESTBEDS["A"], 8, 24)
    whole = RooflineCost(MODELS["hunyuan_video"], w, TESTBEDS["A"], 8, 24)
    for c in (24, 48, 72, 25):
        runs = -(-c * 8 // 24)  # ceil(c / 3) cells of the chunk train
        assert third.time("train_chunk", c, "trainer") == whole.time("train_chunk", runs, "trainer")
    assert third.time("denoise", 4, "generator") == whole.time("denoise", 4, "generator")  # rollout unchanged
    with pytest.raises(PresetError, match="trained_share"):
        replace(w, trained_share=0.0)


def test_config_share_from_best_of_n_and_sample_minibatches():
    base = ["train.generations=24", "train.prompts_per_step=4"]
    assert trained_share(load_config(None, base)) == 1.0
    assert trained_share(load_config(None, [*base, "train.best_of_n=8"])) == pytest.approx(8 / 24)
    both = load_config(None, [*base, "train.best_of_n=8", "train.minibatch_split=samples",
                              "train.minibatches_per_step=2", "runtime.mode=colocated"])
    assert trained_share(both) == pytest.approx(8 / 24 / 2)
