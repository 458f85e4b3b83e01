"""Prompt-embedding cache (text encoders run once, then dropped) and refusal of incomplete model directories."""

from __future__ import annotations

import json
import shutil
import weakref

import pytest
import torch

import tiny_diffusers as td
from digenrl.config import ModelConfig
from digenrl.models.diffusers_files import ModelFilesError
from digenrl.models.prompt_cache import PromptCache, PromptCacheMiss
from digenrl.models.registry import build_policy
from digenrl.rollout.records import Prompt

TEXTS = ["a red cat", "a big dog", "the small green photo"]
OPTS = {"height": 16, "width": 16, "max_sequence_length": 8}


@pytest.fixture(scope="module")
def flux_dir(tmp_path_factory):
    return td.save_flux(tmp_path_factory.mktemp("flux") / "model")


def policy(path, cache, **options):
    return build_policy(ModelConfig(kind="flux", path=str(path), prompt_cache_dir=str(cache) if cache else None,
                                    options={**OPTS, **options}))  # fmt: skip


def test_cache_matches_pipeline_encoder_and_encoders_can_be_dropped(flux_dir, tmp_path):
    from diffusers import FluxPipeline

    pol = policy(flux_dir, tmp_path / "cache")
    assert pol.has_text_encoders
    te_ref = weakref.ref(pol._pipe.text_encoder_2)
    n_params = sum(p.numel() for p in pol.parameters())
    assert pol.cache_prompts(TEXTS, drop_encoders=True) == len(TEXTS) + 1  # + the negative prompt
    assert not pol.has_text_encoders and pol._pipe.text_encoder is None and pol._pipe.tokenizer_2 is None
    assert te_ref() is None  # the T5 encoder is freed, not just detached
    assert sum(p.numel() for p in pol.parameters()) == n_params  # encoders were never trainable submodules

    cond = pol.encode_prompts([Prompt(i, t) for i, t in enumerate(TEXTS)])
    pipe = FluxPipeline.from_pretrained(str(flux_dir), local_files_only=True)
    pe, pooled, _ = pipe.encode_prompt(prompt=TEXTS, prompt_2=None, max_sequence_length=8)
    torch.testing.assert_close(cond["prompt_embeds"], pe)
    torch.testing.assert_close(cond["pooled_prompt_embeds"], pooled)

    with pytest.raises(PromptCacheMiss, match="not in the prompt cache"):
        pol.encode_prompts([Prompt(9, "a blue dog")])
    assert len(list((tmp_path / "cache").glob("*.safetensors"))) == 1  # one shard for the whole prompt set


def test_precomputed_cache_without_text_encoders(flux_dir, tmp_path):
    pol = policy(flux_dir, tmp_path / "cache")
    pol.cache_prompts(TEXTS)
    expected = pol.encode_prompts([Prompt(0, TEXTS[1])])

    bare = tmp_path / "bare"  # a model directory that ships no text encoders at all
    shutil.copytree(flux_dir, bare)
    for comp in ("text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2"):
        shutil.rmtree(bare / comp)
    worker = policy(bare, tmp_path / "cache")
    assert not worker.has_text_encoders
    got = worker.encode_prompts([Prompt(0, TEXTS[1])])
    for k in expected:
        torch.testing.assert_close(got[k], expected[k])
    assert worker.null_cond(3)["prompt_embeds"].shape[0] == 3

    with pytest.raises(ValueError, match="no prompt cache manifest"):
        policy(bare, tmp_path / "empty-cache")
    with pytest.raises(ModelFilesError, match="text_encoder/"):
        policy(bare, None)


def test_encoder_options_change_the_key(flux_dir, tmp_path):
    a = policy(flux_dir, tmp_path / "c")
    a.cache_prompts(TEXTS[:1])
    with pytest.raises(ValueError, match="holds the embeddings of encoder"):  # one encoder per directory
        policy(flux_dir, tmp_path / "c", max_sequence_length=6)
    b = policy(flux_dir, tmp_path / "c6", max_sequence_length=6)
    assert a.prompt_cache.encoder_id != b.prompt_cache.encoder_id
    assert b.prompt_cache.missing(TEXTS[:1]) == TEXTS[:1]  # no stale rows from another encoding
    assert b.encode_prompts([Prompt(0, TEXTS[0])])["prompt_embeds"].shape[1] == 6
    assert PromptCache.read_encoder_ids(tmp_path / "c") == [a.prompt_cache.encoder_id]


def test_the_config_alone_gives_the_policys_encoder_id(flux_dir, tmp_path):
    """``registry.run_encoder_id`` (what ``validate`` and ``prompt_cache_covers`` read, no model loaded) is the id the
    built policy uses, with ``max_sequence_length`` given and left to the family default alike."""
    from digenrl.models.registry import prompt_cache_covers, run_encoder_id

    for options in ({**OPTS}, {"height": 16, "width": 16}):
        cfg = ModelConfig(kind="flux", path=str(flux_dir), prompt_cache_dir=str(tmp_path / str(len(options))),
                          options=options)  # fmt: skip
        pol = build_policy(cfg)
        assert run_encoder_id(cfg) == pol.prompt_cache.encoder_id
        assert not prompt_cache_covers(cfg, TEXTS[:1])
        pol.cache_prompts(TEXTS[:1])
        assert prompt_cache_covers(cfg, TEXTS[:1]) and not prompt_cache_covers(cfg, TEXTS[:2])


def test_missing_or_incomplete_model_dirs_are_refused(tmp_path):
    sd3 = td.save_sd3(tmp_path / "sd3")
    with pytest.raises(ModelFilesError, match="does not exist"):
        build_policy(ModelConfig(kind="sd3", path=str(tmp_path / "nope")))
    with pytest.raises(ModelFilesError, match="model.path"):
        build_policy(ModelConfig(kind="wan", path=None))
    for weights in (sd3 / "vae").glob("*.safetensors"):
        weights.unlink()
    shutil.rmtree(sd3 / "scheduler")
    with pytest.raises(ModelFilesError) as err:
        build_policy(ModelConfig(kind="sd3", path=str(sd3)))
    msg = str(err.value)
    assert str(sd3) in msg and "vae/*.safetensors" in msg and "scheduler/ (subfolder)" in msg
    (sd3 / "model_index.json").write_text("{not json")
    with pytest.raises(ModelFilesError, match="model_index.json"):
        build_policy(ModelConfig(kind="sd3", path=str(sd3)))


def test_cache_rows_round_trip(tmp_path):
    cache = PromptCache(tmp_path, "fam-1")
    cond = {"e": torch.randn(2, 3, 4), "m": torch.tensor([[1, 1, 0], [1, 0, 0]])}
    cache.put(["x", "y"], cond)
    fresh = PromptCache(tmp_path, "fam-1")  # new process: reads from disk
    out = fresh.get(["y", "x", "y"])
    torch.testing.assert_close(out["e"], cond["e"][[1, 0, 1]])
    torch.testing.assert_close(out["m"], cond["m"][[1, 0, 1]])
    assert json.loads((tmp_path / "manifest.json").read_text())["encoder_ids"] == ["fam-1"]
    with pytest.raises(PromptCacheMiss, match="'z'"):
        fresh.get(["z"])


def test_cache_prompts_cli(flux_dir, tmp_path, capsys, monkeypatch):
    import diffusers

    from digenrl.tasks.cache_prompts_cli import main

    def refuse(*a, **k):
        raise AssertionError("cache-prompts must not load the transformer or the VAE")

    monkeypatch.setattr(diffusers.FluxTransformer2DModel, "from_pretrained", refuse)
    monkeypatch.setattr(diffusers.AutoencoderKL, "from_pretrained", refuse)

    prompts = tmp_path / "train.jsonl"
    prompts.write_text('{"prompt": "a red cat"}\n{"prompt": "a big dog"}\n')
    args = ["model.kind=flux", f"model.path={flux_dir}", f"model.prompt_cache_dir={tmp_path / 'c'}",
            "model.options={height: 16, width: 16, max_sequence_length: 8}", "task.name=text",
            f"task.prompts_file={prompts}"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "cached 3 new prompt embeddings" in out  # 2 prompts + the negative prompt
    assert "transformer" not in out.split("loaded:")[1] and "text_encoder_2" in out
    monkeypatch.undo()
    pol = policy(flux_dir, tmp_path / "c", load_text_encoders=False)  # a run reads what cache-prompts wrote
    assert pol.encode_prompts([Prompt(0, "a big dog")])["prompt_embeds"].shape == (1, 8, 16)
    assert main(["model.nope=1"]) == 2
    (tmp_path / "bad.jsonl").write_text('{"prompt": "ok"}\n{"text": 1}\n')
    assert main(args[:-1] + [f"task.prompts_file={tmp_path / 'bad.jsonl'}"]) == 2
    assert "bad.jsonl:2" in capsys.readouterr().out


def test_sharded_cache_lru_and_other_writers(tmp_path):
    g = torch.Generator().manual_seed(0)
    texts = [f"prompt {i}" for i in range(50)]
    cond = {"e": torch.randn(50, 3, generator=g), "m": torch.arange(50)}
    writer = PromptCache(tmp_path, "fam-1", shard_rows=16)
    with writer.bulk():
        writer.put(texts[:20], {k: v[:20] for k, v in cond.items()})
        writer.put(texts[20:], {k: v[20:] for k, v in cond.items()})
    shards = sorted(tmp_path.glob("shard-*.safetensors"))
    assert len(shards) == 2  # 20 rows (>= 16) flushed as one shard, the other 30 at the end of bulk()

    reader = PromptCache(tmp_path, "fam-1", max_rows=8)  # a new process: only the headers are read
    assert len(reader._index) == 50 and len(reader._mem) == 0
    out = reader.get(texts[::-1])
    torch.testing.assert_close(out["e"], cond["e"].flip(0))
    torch.testing.assert_close(out["m"], cond["m"].flip(0))
    assert len(reader._mem) == 8 and list(reader._mem) == texts[7::-1]  # LRU: the 8 most recent rows
    reader.get_row(texts[7])
    assert list(reader._mem)[-1] == texts[7]

    with pytest.raises(ValueError, match="fam-1"):  # another encoder id is refused: one encoder per directory
        PromptCache(tmp_path, "fam-2")
    writer.put(["late"], {"e": torch.ones(1, 3), "m": torch.tensor([7])})  # outside bulk(): written at once
    torch.testing.assert_close(reader.get(["late"])["m"], torch.tensor([7]))  # picked up on a miss


def test_reads_the_per_prompt_files_of_the_earlier_layout(tmp_path):
    from safetensors.torch import save_file

    from digenrl.models.prompt_cache import prompt_key

    row = {"e": torch.randn(3)}
    save_file(row, str(tmp_path / f"{prompt_key('fam-1', 'old prompt')}.safetensors"))
    torch.testing.assert_close(PromptCache(tmp_path, "fam-1").get(["old prompt"])["e"], row["e"][None])
