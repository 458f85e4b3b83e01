"""The one registry of model facts (``models.specs``): one spelling per family everywhere, the documented aliases,
and the readers that take their facts from it (the adapters' defaults, the memory plan, the simulator)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from digenrl.models.registry import policy_kinds
from digenrl.models.specs import ALIASES, SPECS, canonical, spec

DIFFUSERS_KINDS = set(policy_kinds()) - {"tiny_dit"}  # the config's model.kind values with a published config


def test_every_reader_spells_each_family_as_model_kind():
    from digenrl.model_options import FAMILY_OPTIONS
    from digenrl.models.lora import FAMILY_TARGETS
    from digenrl.sim.baselines import DANCEGRPO, FLOW_GRPO
    from digenrl.sim.efficiency import MEASUREMENTS
    from digenrl.sim.presets import MODELS, WORKLOADS
    from digenrl.train.memory import FAMILIES

    assert set(SPECS) == DIFFUSERS_KINDS == set(FAMILIES) == set(MODELS) == set(WORKLOADS)
    assert set(FAMILY_TARGETS) == DIFFUSERS_KINDS and set(FAMILY_OPTIONS) == DIFFUSERS_KINDS | {"tiny_dit"}
    assert set(FLOW_GRPO) | set(DANCEGRPO) | {m.model for m in MEASUREMENTS} <= DIFFUSERS_KINDS
    for k, s in SPECS.items():
        assert s.kind == k and FAMILIES[k].spec is s and MODELS[k].spec is s


def test_aliases_are_the_simulators_old_spellings_and_nothing_else():
    from digenrl.sim.presets import MODELS, PresetError, model_preset

    assert ALIASES == {"hunyuan": "hunyuan_video", "qwen-image": "qwen_image", "sd35-medium": "sd3"}
    for alias, kind in ALIASES.items():
        assert canonical(alias) == kind and spec(alias) is SPECS[kind] and model_preset(alias) is MODELS[kind]
    assert canonical("flux") == "flux"
    with pytest.raises(KeyError, match="known: sd3, flux"):
        spec("tiny_dit")
    with pytest.raises(PresetError, match="--model"):
        model_preset("hunyuan-video")


def test_widths_and_geometry_from_the_published_configs():
    """Heads and widths as the published config.json files state them (numbers typed here from the model cards:
    HunyuanVideo 24 x 128, Wan2.1-14B 40 x 128, FLUX.1 / Qwen-Image 24 x 128, SD3.5-Medium 24 x 64)."""
    want = {"hunyuan_video": (24, 128), "wan": (40, 128), "flux": (24, 128), "qwen_image": (24, 128), "sd3": (24, 64)}
    for k, (heads, dim) in want.items():
        assert (SPECS[k].heads, SPECS[k].head_dim, SPECS[k].hidden) == (heads, dim, heads * dim)
    # HunyuanVideo at 720 x 1280 x 129 frames: 33 latent frames of 45 x 80 patches of 2 x 2 latent pixels
    assert SPECS["hunyuan_video"].latent_tokens(720, 1280, 129) == 33 * 45 * 80 == 118_800
    assert SPECS["wan"].latent_tokens(720, 1280, 81) == 21 * 45 * 80 == 75_600
    assert SPECS["flux"].latent_tokens(512, 512) == 32 * 32 and SPECS["sd3"].text_tokens() == 77 + 256
    assert SPECS["sd3"].text_tokens(128) == 77 + 128


def test_the_adapters_defaults_are_the_registrys():
    pytest.importorskip("diffusers")
    from digenrl.models.registry import family_policy_class

    for k, s in SPECS.items():
        opts = dict(family_policy_class(k).spec.default_options)
        h, w, f = s.default_size
        assert (opts["height"], opts["width"], opts["max_sequence_length"]) == (h, w, s.max_sequence_length)
        assert opts.get("frames", 1) == f
        assert opts.get("negative_prompt", "") == (" " if k == "qwen_image" else "")  # Flow-GRPO's Qwen-Image script: [" "]


def test_the_memory_plan_and_the_simulator_read_one_parameter_count():
    from digenrl.sim.presets import MODELS
    from digenrl.train.memory import FAMILIES

    for k, s in SPECS.items():
        assert FAMILIES[k].params == MODELS[k].archi.params == s.arch.params
        assert FAMILIES[k].hidden == MODELS[k].hidden == s.hidden


def test_the_registry_imports_without_torch():
    code = ("import sys, digenrl.models.specs as s\n"
            "[x.arch.params for x in s.SPECS.values()]\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
