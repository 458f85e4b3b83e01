"""Shared fixtures of the runtime tests: one local Ray for the whole session, a tiny random demo model."""

from __future__ import annotations

import logging

import pytest
import torch

torch.set_num_threads(1)

# labels for the heterogeneous-pool test: generators on "gen_slot" nodes, trainers on "trn_slot" nodes
RAY_RESOURCES = {"gen_slot": 2.0, "trn_slot": 2.0}

@pytest.fixture(scope="session")
def ray_local():
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(num_cpus=4, resources=RAY_RESOURCES, include_dashboard=False, logging_level=logging.ERROR,
                 log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    from digenrl.models.tiny_dit import TinyDiTConfig, TinyDiTPolicy

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("model") / "tiny.safetensors"
    TinyDiTPolicy(TinyDiTConfig(dim=32, depth=1, heads=2)).save(path)
    return path
