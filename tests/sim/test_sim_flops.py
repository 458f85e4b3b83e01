"""Per-stream parameter counts and forward FLOPs against the diffusers transformers themselves (meta device).

Oracles: (1) the diffusers class built from the same config on the meta device, its parameters classified here
by module name into the streams their tokens pass; (2) ``torch.utils.flop_counter.FlopCounterMode`` over a
meta-device forward (counts every matmul, linear and scaled-dot-product attention). Neither uses the closed
forms of ``digenrl.models.flops`` (the configs are the registry's, ``digenrl.models.specs``).
"""

from __future__ import annotations

import re

import pytest

from digenrl.models.specs import SPECS

ARCHS = {k: s.arch for k, s in SPECS.items()}

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")


def _stream_of(family: str, name: str, p) -> str:
    """Which tokens pass this parameter, read off its module path (independent of the closed forms)."""
    if p.dim() == 1 and re.search(r"norm(_q|_k|_added_q|_added_k|1|2)?\.(weight|bias)$", name) and \
            not re.search(r"\.linear\.", name):
        if not name.endswith("bias") or "norm" in name.split(".")[-2]:
            return "elementwise"
    if "scale_shift_table" in name or name.startswith("txt_norm."):
        return "elementwise"
    # per-sample conditioning: timestep / guidance / pooled-text embedders, AdaLN modulation linears
    if re.search(r"(time_text_embed|time_embedder|time_proj|\.norm1(_context)?\.linear|\.norm\.linear|"
                 r"^norm_out\.linear|_mod\.1|token_refiner\.refiner_blocks\.\d+\.norm_out)", name):
        return "sample"
    if family == "wan":
        if re.search(r"(text_embedder|attn2\.to_[kv]\.)", name):
            return "txt"
        return "img"
    if "token_refiner" in name or name.startswith(("context_embedder", "txt_in")):
        return "txt"
    if name.startswith("single_transformer_blocks"):
        return "joint"
    if re.search(r"(add_[qkv]_proj|to_add_out|ff_context|txt_mlp)", name):
        return "txt"
    return "img"


def _meta_model(key: str):
    s = SPECS[key]
    cls = getattr(diffusers, s.diffusers_class)
    with torch.device("meta"):
        return cls(**s.config)


@pytest.mark.parametrize("key", sorted(ARCHS))
def test_stream_counts_match_the_diffusers_model(key):
    m = _meta_model(key)
    got = {"img": 0, "txt": 0, "joint": 0, "sample": 0, "elementwise": 0}
    for name, p in m.named_parameters():
        got[_stream_of(key, name, p)] += p.numel()
    s = ARCHS[key].streams
    assert {"img": s.img, "txt": s.txt, "joint": s.joint, "sample": s.sample, "elementwise": s.elementwise} == got
    assert s.total == sum(p.numel() for p in m.parameters())


def _forward_inputs(key: str, n_img_side: tuple[int, int, int], n_txt: int):
    """Inputs of one meta-device forward: (frames, height, width) latent tokens after patchify."""
    f, hh, ww = n_img_side
    dt, dev = torch.bfloat16, "meta"
    c = SPECS[key].config
    t = torch.empty(1, device=dev)
    if key == "flux":
        return dict(hidden_states=torch.empty(1, hh * ww, 64, device=dev, dtype=dt),
                    encoder_hidden_states=torch.empty(1, n_txt, 4096, device=dev, dtype=dt),
                    pooled_projections=torch.empty(1, 768, device=dev, dtype=dt), timestep=t, guidance=t,
                    img_ids=torch.zeros(hh * ww, 3), txt_ids=torch.zeros(n_txt, 3), return_dict=False)
    if key == "qwen_image":
        return dict(hidden_states=torch.empty(1, hh * ww, 64, device=dev, dtype=dt),
                    encoder_hidden_states=torch.empty(1, n_txt, c["joint_attention_dim"], device=dev, dtype=dt),
                    encoder_hidden_states_mask=torch.ones(1, n_txt, device=dev, dtype=torch.long), timestep=t,
                    img_shapes=[(1, hh, ww)], return_dict=False)
    if key == "sd3":
        return dict(hidden_states=torch.empty(1, 16, 2 * hh, 2 * ww, device=dev, dtype=dt),
                    encoder_hidden_states=torch.empty(1, n_txt, 4096, device=dev, dtype=dt),
                    pooled_projections=torch.empty(1, 2048, device=dev, dtype=dt), timestep=t, return_dict=False)
    if key == "wan":
        return dict(hidden_states=torch.empty(1, 16, f, 2 * hh, 2 * ww, device=dev, dtype=dt), timestep=t,
                    encoder_hidden_states=torch.empty(1, n_txt, 4096, device=dev, dtype=dt), return_dict=False)
    if key == "hunyuan_video":
        return dict(hidden_states=torch.empty(1, 16, f, 2 * hh, 2 * ww, device=dev, dtype=dt), timestep=t,
                    encoder_hidden_states=torch.empty(1, n_txt, 4096, device=dev, dtype=dt),
                    encoder_attention_mask=torch.ones(1, n_txt, device=dev, dtype=torch.long),
                    pooled_projections=torch.empty(1, 768, device=dev, dtype=dt), guidance=t * 1000,
                    return_dict=False)
    raise KeyError(key)


@pytest.mark.parametrize("key", sorted(ARCHS))
def test_forward_flops_match_the_flop_counter(key):
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)
    m = _meta_model(key).to(torch.bfloat16)
    shape, n_txt = ((3, 8, 12), 32) if SPECS[key].video else ((1, 16, 24), 40)
    n_img = shape[0] * shape[1] * shape[2]
    with FlopCounterMode(display=False) as fc:
        m(**_forward_inputs(key, shape, n_txt))
    counted = fc.get_total_flops()
    ours = ARCHS[key].forward_flops(n_img, n_txt)
    # the counter sees matmuls only (no elementwise work), as the closed form does; the only gap is the
    # modulation and embedder matmuls on the 1-row timestep vectors, which both count
    assert ours == pytest.approx(counted, rel=1e-3)


@pytest.mark.parametrize("key", sorted(ARCHS))
def test_lora_target_widths_match_the_diffusers_blocks(key):
    """LoRA adapts every token-stream nn.Linear inside the blocks (not the modulation): sum of in + out."""
    m = _meta_model(key)
    dims = 0
    for name, mod in m.named_modules():
        if not isinstance(mod, torch.nn.Linear) or not re.match(r"^(transformer_blocks|single_transformer_blocks|"
                                                                  r"blocks)\.", name):
            continue
        if re.search(r"(norm1(_context)?\.linear|norm\.linear|_mod\.1)$", name):
            continue
        dims += mod.in_features + mod.out_features
    assert ARCHS[key].adapter_dims == dims
    assert ARCHS[key].lora_params(64) == 64 * dims
