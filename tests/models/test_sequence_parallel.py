"""Sequence parallelism of the video transformers over 2 spawned gloo ranks against the unsplit model.

Wan2.1 (diffusers' own ``_cp_plan``; 4 ranks in 2 groups) and HunyuanVideo (DigenRL's plan, ``models.hunyuan_video_sp``), tiny random
weights, a 2-frame latent video of 32 (Wan) / 128 (HunyuanVideo) tokens split 2 ways, CFG (Wan) or the guidance
embedding with padded text (HunyuanVideo): the velocity, a sampled trajectory and its per-step log-probs equal the
unsplit model's, and the ranks' gradients of a chunk's loss (``train_cells``) sum to its gradient (each rank holds
the part of its own tokens; the attention key biases, whose exact gradient is 0, only inside the global norm).
Oracle: the same model before the split, in each process (diffusers' forward and autograd). Measured (float32):
velocity, trajectories and log-probs bitwise equal; gradients within 1.7e-6 (Wan) and 3.5e-7 (HunyuanVideo)
per tensor. Without the sum over ranks in the text head gather's adjoint (``models.ulysses``) HunyuanVideo's
gradients are off by 0.63.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tiny_diffusers as td  # noqa: E402

FAMILIES = {  # save, options, cond shapes, masks, cfg
    "wan": (td.save_wan, {"height": 16, "width": 16, "frames": 3}, {"prompt_embeds": (6, 16)}, None, 4.0),
    "hunyuan_video": (td.save_hunyuan_video, {"height": 16, "width": 16, "frames": 5},
                      {"prompt_embeds": (6, 16), "pooled_prompt_embeds": (8,)}, {"prompt_mask": 4}, 6.0),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(tmp_path, family: str, lora: bool, world: int = 2):
    import torch.multiprocessing as mp

    import sp_worker

    save, options, shapes, masks, cfg = FAMILIES[family]
    model = save(tmp_path / family)
    cache = tmp_path / f"{family}-cache"
    td.random_cache(cache, f"{family}-test", ["a red cat", "a big dog", ""], shapes, masks=masks)
    out = tmp_path / "out"
    out.mkdir()
    mp.spawn(sp_worker.run, args=(world, _free_port(), family, str(model), str(cache), options, cfg, lora, str(out)),
             nprocs=world, join=True)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.slow
@pytest.mark.parametrize("family,lora,world", [("wan", False, 4), ("hunyuan_video", False, 2), ("hunyuan_video", True, 2)])
def test_split_sequence_equals_the_whole(tmp_path, family, lora, world):
    """Wan on 4 ranks in 2 sequence groups of 2 (each splits its own copy of the batch)."""
    for r in _spawn(tmp_path, family, lora, world):
        assert r["velocity_moved"] > 0.5  # the model computes something
        assert r["block_tokens"] * 2 == r["tokens"]  # the blocks saw half of the sequence on each rank
        # no process group made on the way (``models.sequence_parallel``: one made by the ranks of one sequence
        # group only collides in the world's store with another group's; the trainer creates them all up front)
        assert r["groups_created"] == [0, 0], r
        assert r["velocity"] < 1e-5 and r["final"] < 1e-5, r
        assert r["log_probs"] < 1e-5, r
        assert r["grad_names"] and r["n_grads"] > 0, r
        assert r["grad_worst"] < 1e-4 and r["grad_global"] < 1e-5, r


def test_degree_must_divide_heads_and_tokens(tmp_path):
    """Refused before any collective, naming the keys: 3 does not divide the 2 heads; 2 does not divide the
    3 x 3 tokens of a one-frame 12 x 12 video."""
    from digenrl.config import ModelConfig
    from digenrl.models.registry import build_policy
    from digenrl.models.sequence_parallel import check_divisible, sequence_length

    save, options, shapes, masks, _ = FAMILIES["wan"]
    cache = tmp_path / "cache"
    td.random_cache(cache, "wan-test", ["a red cat", ""], shapes, masks=masks)
    path = str(save(tmp_path / "wan"))

    def policy(**opts):
        return build_policy(ModelConfig(kind="wan", path=path, prompt_cache_dir=str(cache), options=opts))

    p = policy(**options)
    assert sequence_length(p) == 2 * 4 * 4  # 2 latent frames x (16 / 2 / 2)^2 patches
    check_divisible(p, 2)
    with pytest.raises(ValueError, match=r"train\.sequence_parallel: degree 3 does not divide the 2 attention heads"):
        check_divisible(p, 3)
    small = policy(height=12, width=12, frames=1)
    assert sequence_length(small) == 9
    with pytest.raises(ValueError, match=r"runtime\.generator_sequence_parallel: degree 2 does not divide the 9 "
                                         r"latent tokens .*model\.options"):
        check_divisible(small, 2, "runtime.generator_sequence_parallel")


def test_config_refuses_what_has_no_plan():
    from digenrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"train\.sequence_parallel: model\.kind 'tiny_dit' has no sequence-parallel"):
        load_config(None, ["train.sequence_parallel=2", "runtime.trainers=2"])
    with pytest.raises(ConfigError, match=r"train\.sequence_parallel: model\.kind 'sd3'"):
        load_config(None, ["model.kind=sd3", "train.sequence_parallel=2", "runtime.trainers=2"])
    with pytest.raises(ConfigError, match=r"degree 2 does not divide runtime\.trainers = 3"):
        load_config(None, ["model.kind=wan", "train.sequence_parallel=2", "runtime.trainers=3"])
    with pytest.raises(ConfigError, match=r"degree 2 does not divide each shard group's .* = 3"):
        load_config(None, ["model.kind=wan", "train.sequence_parallel={ulysses: 2}", "runtime.trainers=6",
                           "train.sharding=fsdp", "train.shard_groups=2"])
    with pytest.raises(ConfigError, match=r"train\.sequence_parallel\.ring: 2: ring attention"):
        load_config(None, ["model.kind=wan", "train.sequence_parallel={ring: 2}", "runtime.trainers=2"])
    with pytest.raises(ConfigError, match=r"runtime\.generator_sequence_parallel: model\.kind 'flux'"):
        load_config(None, ["model.kind=flux", "runtime.mode=naive", "runtime.generator_sequence_parallel=2"])
    cfg = load_config(None, ["model.kind=hunyuan_video", "train.sequence_parallel=2", "runtime.trainers=4",
                             "train.sharding=fsdp"])
    assert cfg.train.sequence_parallel.degree == 2 and cfg.train.sequence_parallel.ring == 1
    assert torch is not None
