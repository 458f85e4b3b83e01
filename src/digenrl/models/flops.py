"""Per-stream parameter counts and forward FLOPs of the flow-matching transformers, from their diffusers configs.

A forward of one sample with ``n_img`` latent tokens and ``n_txt`` text tokens costs (multiply-add = 2 FLOPs)::

    F = 2 * (P_img * n_img + P_txt * n_txt + P_joint * (n_img + n_txt) + P_sample)     (linear layers)
      + sum over attention layers of 4 * n_q * n_kv * d_attn                           (QK^T and AV)

where the parameters of the network are split by what passes through them:

* ``img``: weights every latent (image/video) token passes (image stream of dual-stream blocks, Wan's
  self-attention and FFN, patch embedding, output projection);
* ``txt``: weights every text token passes (text stream of dual-stream blocks, text embedders, HunyuanVideo's
  token refiner, Wan's cross-attention keys/values);
* ``joint``: weights of single-stream blocks, passed by image and text tokens alike;
* ``sample``: weights applied once per sample (AdaLN modulation from the timestep/guidance/pooled-text
  embedding, the embedders of those vectors, the final norm's modulation);
* ``elementwise``: norm scales and modulation tables (no matmul; left out of F).

``2 * params * seq`` would charge every token for every weight: it overcounts dual-stream models (a token passes
only its own stream) and charges the per-sample modulation (a sixth of FLUX's weights) once per token.

The config values are the published diffusers ``transformer/config.json`` of each model, from the one registry
(``models.specs``: ``ModelSpec.arch`` is this module's ``Arch`` of the spec); ``tests/sim/test_sim_flops.py``
instantiates the diffusers class on the meta device from the same values and checks every stream count and the
total forward FLOPs (``torch.utils.flop_counter``) against these closed forms.

Sequence parallelism (``sp`` = d ranks split one sample's latent tokens, Ulysses; docs/sequence_parallel.md): one
rank's share of a forward. Each rank runs the linear layers on its ``n_img / d`` latent tokens and on every text
token (the text stream and HunyuanVideo's refiner run whole on every rank), and each attention on H / d heads over
the whole sequence (Wan's cross-attention: its ``n_img / d`` queries on every head)::

    F_d = 2 (P_img n_img / d + P_txt n_txt + P_joint (n_img / d + n_txt) + P_sample) + A / d
          (A: the attention FLOPs of the unsplit forward, HunyuanVideo's text-only refiner not divided)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Streams:
    """Parameter counts by the tokens that pass them (see the module docstring)."""

    img: int
    txt: int
    joint: int
    sample: int
    elementwise: int

    @property
    def total(self) -> int:
        return self.img + self.txt + self.joint + self.sample + self.elementwise

    def __add__(self, o: "Streams") -> "Streams":
        return Streams(self.img + o.img, self.txt + o.txt, self.joint + o.joint, self.sample + o.sample,
                       self.elementwise + o.elementwise)

    def __mul__(self, k: int) -> "Streams":
        return Streams(self.img * k, self.txt * k, self.joint * k, self.sample * k, self.elementwise * k)


def lin(i: int, o: int, bias: bool = True) -> int:
    """Parameters of nn.Linear(i, o)."""
    return i * o + (o if bias else 0)


def mlp2(i: int, h: int, o: int | None = None) -> int:
    """Two-layer MLP i -> h -> o (diffusers FeedForward / TimestepEmbedding)."""
    return lin(i, h) + lin(h, i if o is None else o)


@dataclass(frozen=True)
class Arch:
    """A transformer family: its per-stream parameters and its attention layers.

    ``attn``: tuples (layers, kind) with kind ``joint`` (over n_img + n_txt), ``img`` (over n_img), ``cross``
    (n_img queries on n_txt keys) or ``txt`` (over n_txt)."""

    streams: Streams
    d_attn: int
    attn: tuple[tuple[int, str], ...]
    adapter_dims: int = 0   # sum of (in + out) over the blocks' token-stream linear layers (LoRA targets)

    def lora_params(self, rank: int) -> int:
        """Parameters of rank-``rank`` LoRA adapters (A: in x r, B: r x out) on every token-stream linear."""
        return rank * self.adapter_dims

    def attention_flops(self, n_img: int, n_txt: int, sp: int = 1) -> float:
        """QK^T and AV of every attention layer; one rank's share of them under ``sp``-way sequence parallelism
        (the text-only refiner is not split)."""
        pairs = {"joint": (n_img + n_txt) ** 2, "img": n_img ** 2, "cross": n_img * n_txt, "txt": n_txt ** 2}
        return sum(4.0 * layers * pairs[kind] * self.d_attn / (1 if kind == "txt" else sp)
                   for layers, kind in self.attn)

    def linear_flops(self, n_img: float, n_txt: int, sp: int = 1) -> float:
        s, n = self.streams, n_img / sp
        return 2.0 * (s.img * n + s.txt * n_txt + s.joint * (n + n_txt) + s.sample)

    def forward_flops(self, n_img: int, n_txt: int, sp: int = 1) -> float:
        """FLOPs of one transformer forward of one sample (no CFG doubling); with ``sp`` > 1 one rank's share
        (module docstring)."""
        return self.linear_flops(n_img, n_txt, sp) + self.attention_flops(n_img, n_txt, sp)

    def attention_layers(self, *kinds: str) -> int:
        """Attention layers of the given kinds (``joint``, ``img``, ``cross``, ``txt``)."""
        return sum(n for n, kind in self.attn if kind in kinds)

    @property
    def params(self) -> int:
        return self.streams.total


# ---- FLUX.1-dev / HunyuanVideo: double-stream (MM-DiT) + single-stream blocks ---------------------------------
def _double_block(h: int, hd: int, mlp: int) -> Streams:
    """One dual-stream block: per stream q, k, v, out + GELU MLP; AdaLN-Zero modulation (6h) per stream."""
    stream = 4 * lin(h, h) + mlp2(h, mlp)
    return Streams(img=stream, txt=stream, joint=0, sample=2 * lin(h, 6 * h), elementwise=4 * hd)


def _dual_single_adapter_dims(h: int, mlp: int, n_double: int, n_single: int) -> int:
    """Per dual-stream block and stream: q, k, v, out (2h each) + MLP (h + mlp twice); per single-stream
    block: q, k, v + MLP-in (h + mlp) + fused output (h + mlp + h)."""
    stream = 4 * 2 * h + 2 * (h + mlp)
    return n_double * 2 * stream + n_single * (3 * 2 * h + (h + mlp) + (h + mlp + h))


def _single_block(h: int, hd: int, mlp: int) -> Streams:
    """One single-stream block: q, k, v, MLP-in fused with attention output (h + mlp -> h); modulation 3h."""
    return Streams(img=0, txt=0, joint=3 * lin(h, h) + lin(h, mlp) + lin(h + mlp, h), sample=lin(h, 3 * h),
                   elementwise=2 * hd)


def _flux(c: dict) -> Arch:
    hd, h = c["attention_head_dim"], c["attention_head_dim"] * c["num_attention_heads"]
    emb = Streams(img=lin(c["in_channels"], h) + lin(h, c["patch_size"] ** 2 * c["in_channels"]),
                  txt=lin(c["joint_attention_dim"], h), joint=0,
                  # timestep, guidance and pooled-CLIP embedders; final AdaLN (scale, shift)
                  sample=mlp2(256, h, h) * (2 if c["guidance_embeds"] else 1) + mlp2(c["pooled_projection_dim"], h, h)
                  + lin(h, 2 * h), elementwise=0)
    s = emb + _double_block(h, hd, 4 * h) * c["num_layers"] + _single_block(h, hd, 4 * h) * c["num_single_layers"]
    return Arch(s, h, ((c["num_layers"] + c["num_single_layers"], "joint"),),
                _dual_single_adapter_dims(h, 4 * h, c["num_layers"], c["num_single_layers"]))


def _hunyuan(c: dict) -> Arch:
    hd, h = c["attention_head_dim"], c["attention_head_dim"] * c["num_attention_heads"]
    mlp, p, pt, te = int(h * c["mlp_ratio"]), c["patch_size"], c["patch_size_t"], c["text_embed_dim"]
    # token refiner: text tokens pass proj_in and 2 self-attention blocks; its timestep/mean-pooled-text
    # conditioning and each block's AdaLN gate are per sample; its LayerNorms (with bias) are elementwise.
    refiner_block = Streams(img=0, txt=4 * lin(h, h) + mlp2(h, mlp), joint=0, sample=lin(h, 2 * h),
                            elementwise=4 * h)
    refiner = (Streams(0, lin(te, h), 0, mlp2(256, h, h) + mlp2(te, h, h), 0)
               + refiner_block * c["num_refiner_layers"])
    emb = Streams(img=c["in_channels"] * pt * p * p * h + h + lin(h, pt * p * p * c["out_channels"]), txt=0, joint=0,
                  sample=mlp2(256, h, h) * (2 if c["guidance_embeds"] else 1) + mlp2(c["pooled_projection_dim"], h, h)
                  + lin(h, 2 * h), elementwise=0)
    s = (emb + refiner + _double_block(h, hd, mlp) * c["num_layers"]
         + _single_block(h, hd, mlp) * c["num_single_layers"])
    return Arch(s, h,
                ((c["num_layers"] + c["num_single_layers"], "joint"), (c["num_refiner_layers"], "txt")),
                _dual_single_adapter_dims(h, mlp, c["num_layers"], c["num_single_layers"]))


def _qwen(c: dict) -> Arch:
    hd, h, jd = c["attention_head_dim"], c["attention_head_dim"] * c["num_attention_heads"], c["joint_attention_dim"]
    block = _double_block(h, hd, 4 * h)
    emb = Streams(img=lin(c["in_channels"], h) + lin(h, c["patch_size"] ** 2 * c["out_channels"]), txt=lin(jd, h),
                  joint=0, sample=mlp2(256, h, h) + lin(h, 2 * h), elementwise=jd)  # txt_norm: RMSNorm scale
    return Arch(emb + block * c["num_layers"], h, ((c["num_layers"], "joint"),),
                _dual_single_adapter_dims(h, 4 * h, c["num_layers"], 0))


def _wan(c: dict) -> Arch:
    h = c["attention_head_dim"] * c["num_attention_heads"]
    pt, ph, pw = c["patch_size"]
    patch = pt * ph * pw
    # per block: self-attention (q, k, v, out) and FFN on video tokens; cross-attention queries/output on video
    # tokens, its keys/values on text tokens; q/k RMSNorm scales (across heads, width h) for both attentions,
    # the cross-attention LayerNorm (scale + bias) and the 6h modulation table are elementwise.
    block = Streams(img=4 * lin(h, h) + 2 * lin(h, h) + mlp2(h, c["ffn_dim"]), txt=2 * lin(h, h), joint=0, sample=0,
                    elementwise=4 * h + (2 * h if c["cross_attn_norm"] else 0) + 6 * h)
    emb = Streams(img=c["in_channels"] * patch * h + h + lin(h, patch * c["out_channels"]),
                  txt=mlp2(c["text_dim"], h, h), joint=0,
                  sample=mlp2(c["freq_dim"], h, h) + lin(h, 6 * h), elementwise=2 * h)
    return Arch(emb + block * c["num_layers"], h,
                ((c["num_layers"], "img"), (c["num_layers"], "cross")),
                c["num_layers"] * (8 * 2 * h + 2 * (h + c["ffn_dim"])))


def _sd35m(c: dict) -> Arch:
    hd, h, p = c["attention_head_dim"], c["attention_head_dim"] * c["num_attention_heads"], c["patch_size"]
    dual, L = set(c["dual_attention_layers"]), c["num_layers"]
    dims = 0
    s = Streams(img=c["in_channels"] * p * p * h + h + lin(h, p * p * c["out_channels"]),
                txt=lin(c["joint_attention_dim"], c["caption_projection_dim"]), joint=0,
                sample=mlp2(256, h, h) + mlp2(c["pooled_projection_dim"], h, h) + lin(h, 2 * h), elementwise=0)
    for i in range(L):
        last = i == L - 1  # the last block is context_pre_only: no text output projection, no text MLP
        img = 4 * lin(h, h) + mlp2(h, 4 * h) + (4 * lin(h, h) if i in dual else 0)
        txt = 3 * lin(h, h) + (0 if last else lin(h, h) + mlp2(h, 4 * h))
        sample = lin(h, (9 if i in dual else 6) * h) + lin(h, (2 if last else 6) * h)
        s = s + Streams(img, txt, 0, sample, 4 * hd + (2 * hd if i in dual else 0))
        dims += 4 * 2 * h + 10 * h + (8 * h if i in dual else 0) + 3 * 2 * h + (0 if last else 2 * h + 10 * h)
    return Arch(s, h, ((L, "joint"), (len(dual), "img")), dims)


_BUILDERS = {"flux": _flux, "hunyuan_video": _hunyuan, "qwen_image": _qwen, "wan": _wan, "sd3": _sd35m}


def arch_of(spec) -> Arch:
    """The ``Arch`` of a ``models.specs.ModelSpec`` (its published config)."""
    return _BUILDERS[spec.kind](dict(spec.config))


__all__ = ["Arch", "Streams", "arch_of", "lin", "mlp2"]
