"""A user's first-hour mistakes (issue 38, item 3): each one, given to ``digenrl train`` in a Ray mode, gets one
line naming the key and what to do, exit code 2, before Ray starts, and leaves nothing changed (no run_dir; the
model directory and the prompt cache byte for byte as they were). Tiny random diffusers models are built here
(``tests/models/tiny_diffusers.py``)."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import tiny_diffusers as td  # noqa: E402

from digenrl.cli import main  # noqa: E402

FAST = ["steps=1", "log.progress=false", "train.prompts_per_step=2", "train.generations=2", "eval.num_prompts=2",
        "sampler.num_steps=2", "--ray", "runtime.mode=gap"]


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(root)).encode() + f.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mistakes")
    prompts = root / "prompts.txt"
    prompts.write_text("a photo of a cat\na red dog\nthe small blue cat\n")
    return {"sd3": td.save_sd3(root / "sd3"), "flux": td.save_flux(root / "flux"), "wan": td.save_wan(root / "wan"),
            "prompts": prompts}


@pytest.fixture
def no_ray(monkeypatch):
    import ray

    import digenrl.runtime.driver as driver

    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started"))
    monkeypatch.setattr(driver, "run_training", lambda *a, **k: pytest.fail("the Ray driver started"))


def _refused(capsys, tmp_path, args, watched=()):
    run = tmp_path / "run"
    before = {p: _tree_digest(p) for p in watched}
    rc = main(["train", f"run_dir={run}", *FAST, *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1, err  # one line
    assert err.startswith("digenrl: error: "), err
    assert not run.exists()
    assert {p: _tree_digest(p) for p in watched} == before  # nothing changed
    return err[len("digenrl: error: "):]


def _text(dirs, kind):
    return [f"model.kind={kind}", f"model.path={dirs[kind]}", "task.name=text", f"task.prompts_file={dirs['prompts']}",
            "reward=jpeg_incompressibility"]


def test_flux_kind_on_an_sd3_directory(dirs, tmp_path, capsys, no_ray):
    args = [*_text(dirs, "sd3"), "model.kind=flux", "model.options={height: 16, width: 16}"]
    err = _refused(capsys, tmp_path, args, [dirs["sd3"]])
    assert err.startswith("model.kind: flux") and "StableDiffusion3Pipeline" in err and "set model.kind=sd3" in err


def test_misspelt_model_option(dirs, tmp_path, capsys, no_ray):
    err = _refused(capsys, tmp_path, [*_text(dirs, "flux"), "model.options.hieght=32"])
    assert err.startswith("model.options.hieght: not an option of model.kind=flux")
    assert "did you mean model.options.height?" in err and "max_sequence_length" in err  # the family's options
    err = _refused(capsys, tmp_path, [*_text(dirs, "flux"), "model.options.height=big"])
    assert err.startswith("model.options.height:") and "integer" in err


def test_resolution_over_the_position_table(dirs, tmp_path, capsys, no_ray):
    # tiny SD3: pos_embed_max_size 16, VAE factor 2, patch 2: at most 64 px per side
    err = _refused(capsys, tmp_path, [*_text(dirs, "sd3"), "model.options={height: 128, width: 16}"], [dirs["sd3"]])
    assert err.startswith("model.options.height: 128 px") and "pos_embed_max_size 16" in err and "at most 64 px" in err
    err = _refused(capsys, tmp_path, [*_text(dirs, "sd3"), "model.options={height: 16, width: 18}"])
    assert err.startswith("model.options.width: 18 is not a multiple of 4")


def test_video_size_off_the_latent_grid(dirs, tmp_path, capsys, no_ray):
    # tiny Wan: VAE factors 2 (space) and 2 (time), patch 1 x 2 x 2; it failed in the workers' start before
    err = _refused(capsys, tmp_path, [*_text(dirs, "wan"), "model.options={height: 16, width: 16, frames: 4}"],
                   [dirs["wan"]])
    assert err == "model.options.frames: 4 - 1 is not a multiple of 2 for wan (the VAE's time factor); use e.g. 3"
    err = _refused(capsys, tmp_path, [*_text(dirs, "flux"), "model.options={height: 16, width: 18}"])
    assert err.startswith("model.options.width: 18 is not a multiple of 4 for flux (VAE factor 2 x patch 2)")


def test_a_sequence_parallel_degree_that_does_not_divide(dirs, tmp_path, capsys, no_ray):
    # tiny Wan: 2 attention heads; 12 x 12 px x 1 frame is 3 x 3 patches of 2 x 2 latent pixels (VAE factor 2)
    args = [*_text(dirs, "wan"), "runtime.trainers=6"]
    err = _refused(capsys, tmp_path, [*args, "train.sequence_parallel=2",
                                      "model.options={height: 12, width: 12, frames: 1}"], [dirs["wan"]])
    assert err.startswith("train.sequence_parallel: degree 2 does not divide the 9 latent tokens of a sample")
    err = _refused(capsys, tmp_path, [*args, "runtime.generator_sequence_parallel=3", "runtime.generators=3",
                                      "model.options={height: 16, width: 16, frames: 3}"])
    assert err.startswith("runtime.generator_sequence_parallel: degree 3 does not divide the 2 attention heads")


def test_lora_targets_that_match_no_module(dirs, tmp_path, capsys, no_ray):
    # the tiny FLUX transformer built on the meta device from its config.json; this failed in the workers' start
    args = [*_text(dirs, "flux"), "model.options={height: 16, width: 16}", "model.lora.enabled=true"]
    err = _refused(capsys, tmp_path, [*args, "model.lora.target_modules=[attn.to_qq, ff.net.9]"], [dirs["flux"]])
    assert err == ("model.lora.target_modules: none of ['attn.to_qq', 'ff.net.9'] matches a module of the flux "
                   "transformer")
    from digenrl.config import load_config
    from digenrl.validate import check_model

    check_model(load_config(None, [f"run_dir={tmp_path}/run", *args, "model.lora.target_modules=[attn.to_q]"]))


def test_prompt_cache_of_another_sequence_length(dirs, tmp_path, capsys, no_ray):
    from digenrl.config import ModelConfig
    from digenrl.models.prompt_cache import PromptCache
    from digenrl.models.registry import run_encoder_id

    cache = tmp_path / "cache"
    other = run_encoder_id(ModelConfig(kind="flux", path=str(dirs["flux"]), options={"max_sequence_length": 8}))
    td.random_cache(cache, other, ["a photo of a cat"], {"prompt_embeds": (8, 16), "pooled_prompt_embeds": (8,)})
    args = [*_text(dirs, "flux"), f"model.prompt_cache_dir={cache}", "model.options={height: 16, width: 16, "
            "max_sequence_length: 6}"]
    err = _refused(capsys, tmp_path, args, [cache, dirs["flux"]])
    assert err.startswith(f"model.prompt_cache_dir: '{cache}' holds the embeddings of encoder {other}")
    assert "max_sequence_length" in err and "digenrl cache-prompts" in err
    assert PromptCache.read_encoder_ids(cache) == [other]


def test_a_cache_is_never_given_a_second_encoder(tmp_path):
    """The library path too (a run that got past the CLI, a notebook): opening a cache with another encoder id
    is refused, and the directory stays usable by its own encoder."""
    from digenrl.models.prompt_cache import PromptCache

    PromptCache(tmp_path, "fam-a").put(["x"], {"e": __import__("torch").zeros(1, 2)})
    manifest = (tmp_path / "manifest.json").read_bytes()
    with pytest.raises(ValueError, match="model.prompt_cache_dir: .* holds the embeddings of encoder fam-a"):
        PromptCache(tmp_path, "fam-b")
    assert (tmp_path / "manifest.json").read_bytes() == manifest
    assert PromptCache(tmp_path, "fam-a").get(["x"])["e"].shape == (1, 2)


@pytest.mark.parametrize("args, start, needles", [
    (["train.lrr=1"], "train.lrr: unknown key; did you mean train.lr?", []),
    (["reward.pickscor=1.0"], "reward.pickscor: unknown reward; did you mean reward.pickscore?",
     ["'module:function' factory", "entry point"]),
    (["reward={digits: {weight: 1, treshold: 2}}"], "reward.digits.treshold: unknown option", []),
    (["reward=pickscor"], "reward.pickscor: unknown reward; did you mean reward.pickscore?", []),
    (["reward=clip_score"], "reward.clip_score: reward clipscore: option model_path", []),  # the alias resolves
])  # fmt: skip
def test_keys_and_rewards(tmp_path, capsys, no_ray, args, start, needles):
    err = _refused(capsys, tmp_path, args)
    assert err.startswith(start), err
    assert all(n in err for n in needles), err
    assert "valid dictionary" not in err


def test_alias_clip_score_is_clipscore():
    from digenrl.rewards.registry import resolve_factory

    assert resolve_factory("clip_score")[0] is resolve_factory("clipscore")[0]
    assert resolve_factory("clip_score")[1].startswith("alias:clipscore:")


def test_config_error_lines_and_list():
    from digenrl.config import ConfigError, load_config

    with pytest.raises(ConfigError) as e:
        load_config(None, ["train.cpu_offload=true"])
    assert str(e.value) == "train.cpu_offload: needs train.sharding=fsdp (FSDP2 offloads the sharded state)"
    with pytest.raises(ConfigError) as e:
        load_config(None, ["train.lrr=1", "steps=-1"])  # two errors: a list, one per line
    assert sorted(str(e.value).splitlines()[1:]) == ["  steps: Input should be greater than or equal to 0 (got -1)",
                                                     "  train.lrr: unknown key; did you mean train.lr?"]
    with pytest.raises(ConfigError, match=r"^zzz: unknown key \(top level keys: run_dir, "):
        load_config(None, ["zzz=1"])
