"""Measuring memory on any device (CPU included): live/peak allocation counting and saved-for-backward bytes,
and the real-width diffusers transformers (fewer layers) the memory plan is calibrated against.

* ``AllocationCounter``: a ``TorchDispatchMode`` that sees every tensor an op returns; a storage it has not
  seen is counted as allocated (its ``nbytes``) until its Python storage object is collected (a weak
  reference with a callback, the technique of ``torch.distributed._tools.mem_tracker``). ``live`` and
  ``peak`` are bytes of the tensors created inside the mode (parameters built inside it included), so on CPU
  this stands in for ``torch.cuda.max_memory_allocated``. With ``shape_only=True`` the matrix products
  (``mm``, ``addmm``, ``bmm``, ``baddbmm``) are not computed: each returns a zero-filled tensor of the shape,
  strides and dtype its meta kernel gives, so every count is the same and only the arithmetic is skipped.
  A probe needs no values, and a 16-bit GEMM on a CPU without native bf16 is slow: measured here (AMD EPYC,
  AVX2 only, torch 2.13), one bf16 forward + backward of two FLUX single blocks at 2 x 176 tokens spent
  360 s of 378 s in ``aten::mm``.
* ``saved_bytes_by_block``: bytes of the tensors autograd saves for backward during one forward
  (``saved_tensors_hooks``), each storage counted once, parameters excluded, attributed to the module kind
  that was running (forward pre/post hooks).
* ``build_transformer``: the diffusers transformer class of a family with the published widths (its
  ``transformer/config.json``, from the registry ``models.specs``) and a chosen number of layers;
  ``transformer_inputs`` makes one batch of inputs with ``img_tokens`` latent tokens and ``txt_tokens`` text
  tokens, mirroring the family adapters' ``_transformer_call``.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map_only

_MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
            torch.ops.aten.baddbmm.default)


class AllocationCounter(TorchDispatchMode):
    """Counts bytes of live tensors created inside the mode; ``peak`` is the high-water mark.
    ``shape_only``: matrix products allocate their outputs without computing them (see the module doc)."""

    def __init__(self, shape_only: bool = False) -> None:
        super().__init__()
        self.shape_only = shape_only
        self.live = 0
        self.peak = 0
        self._refs: dict[int, tuple[weakref.ref, int]] = {}

    def _release(self, key: int, nbytes: int) -> None:
        if self._refs.pop(key, None) is not None:
            self.live -= nbytes

    def track(self, t: torch.Tensor) -> None:
        if t.device.type == "meta" or getattr(t, "is_sparse", False):
            return
        try:
            st = t.untyped_storage()
            key = st.data_ptr()
        except RuntimeError:  # a wrapper subclass without storage of its own (functional collectives'
            return  # AsyncCollectiveTensor): the op that made its inner tensor was counted
        if key == 0 or key in self._refs:
            return
        n = st.nbytes()
        self._refs[key] = (weakref.ref(st, lambda _, k=key, n=n: self._release(k, n)), n)
        self.live += n
        self.peak = max(self.peak, self.live)

    def reset_peak(self) -> None:
        self.peak = self.live

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.shape_only and func in _MATMULS:
            device = next(t.device for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor))
            meta = func(*tree_map_only(torch.Tensor, lambda t: t.to("meta"), args),
                        **tree_map_only(torch.Tensor, lambda t: t.to("meta"), kwargs))
            out = torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype, device=device).zero_()
        else:
            out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.track(t)
        return out


@contextmanager
def _label_modules(root: torch.nn.Module, kinds: dict[str, str], state: dict):
    handles = []
    for path, kind in kinds.items():
        for mod in root.get_submodule(path):
            def pre(m, a, k=kind):
                state["stack"].append(k)

            def post(m, a, o):
                state["stack"].pop()

            handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def saved_bytes_by_block(model: torch.nn.Module, call, kinds: dict[str, str]) -> dict[str, int]:
    """Bytes saved for backward while ``call()`` runs, per block kind (``kinds``: block-list path -> kind;
    everything else is ``"other"``). Parameters and storages already counted are skipped."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: set[int] = set()
    out: dict[str, int] = {}
    state: dict = {"stack": []}

    def pack(t: torch.Tensor):
        st = t.untyped_storage()
        key = st.data_ptr()
        if key not in params and key not in seen and key != 0:
            seen.add(key)
            kind = state["stack"][-1] if state["stack"] else "other"
            out[kind] = out.get(kind, 0) + st.nbytes()
        return t

    with _label_modules(model, kinds, state), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        call()
    return out


def build_transformer(family: str, layers: dict[str, int] | None = None, *, dtype=torch.float32,
                      device="cpu") -> torch.nn.Module:
    """The real-width transformer of ``family`` with ``layers`` (config key -> count; default 1 of each kind).
    Parameters are allocated without initialisation (memory probes do not need values)."""
    import diffusers

    from digenrl.models.specs import SPECS

    spec = SPECS[family]
    cls_name, cfg = spec.diffusers_class, dict(spec.config)
    for key in spec.layer_keys:
        cfg[key] = (layers or {}).get(key, 1)
    cls = getattr(diffusers, cls_name)
    with _skipped_init(), torch.device(device):
        model = cls(**cfg)
    model = model.to(dtype)
    with torch.no_grad():
        for p in model.parameters():  # finite values (no NaN/inf from uninitialised memory); a memset is fast
            p.zero_()
    return model


@contextmanager
def _skipped_init():
    """``torch.nn.init`` functions as no-ops while a model is built (the probe zeroes the weights after)."""
    names = ["uniform_", "normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_",
             "trunc_normal_", "zeros_", "ones_", "constant_", "orthogonal_"]
    saved = {n: getattr(torch.nn.init, n) for n in names}
    try:
        for n in names:
            setattr(torch.nn.init, n, lambda t, *a, **k: t)
        yield
    finally:
        for n, f in saved.items():
            setattr(torch.nn.init, n, f)


def transformer_inputs(family: str, model: torch.nn.Module, batch: int, img_tokens: int, txt_tokens: int,
                       dtype=torch.float32) -> dict[str, Any]:
    """Keyword inputs of one forward with ``img_tokens`` latent tokens (after patchify) and ``txt_tokens`` text
    tokens; shapes follow the family adapters (``models/diffusers_*.py``)."""
    c = model.config
    g = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    sigma = torch.full((batch,), 0.5)
    side = int(round(img_tokens ** 0.5))
    if side * side != img_tokens:
        raise ValueError(f"img_tokens={img_tokens} must be a square number")
    if family == "flux":
        import diffusers

        ids = diffusers.FluxPipeline._prepare_latent_image_ids(batch, side, side, "cpu", dtype)
        return dict(hidden_states=rnd(batch, img_tokens, c.in_channels), timestep=sigma, guidance=torch.full((batch,), 3.5),
                    pooled_projections=rnd(batch, c.pooled_projection_dim),
                    encoder_hidden_states=rnd(batch, txt_tokens, c.joint_attention_dim),
                    txt_ids=torch.zeros(txt_tokens, 3, dtype=dtype), img_ids=ids, return_dict=False)
    if family == "sd3":
        p = c.patch_size
        return dict(hidden_states=rnd(batch, c.in_channels, side * p, side * p), timestep=sigma * 1000.0,
                    encoder_hidden_states=rnd(batch, txt_tokens, c.joint_attention_dim),
                    pooled_projections=rnd(batch, c.pooled_projection_dim), return_dict=False)
    if family == "wan":
        _, ph, pw = c.patch_size
        return dict(hidden_states=rnd(batch, c.in_channels, 1, side * ph, side * pw), timestep=sigma * 1000.0,
                    encoder_hidden_states=rnd(batch, txt_tokens, c.text_dim), return_dict=False)
    if family == "qwen_image":
        return dict(hidden_states=rnd(batch, img_tokens, c.in_channels), timestep=sigma,
                    encoder_hidden_states_mask=torch.ones(batch, txt_tokens, dtype=torch.long),
                    encoder_hidden_states=rnd(batch, txt_tokens, c.joint_attention_dim),
                    img_shapes=[[(1, side, side)]] * batch, return_dict=False)
    if family == "hunyuan_video":
        p = c.patch_size
        return dict(hidden_states=rnd(batch, c.in_channels, 1, side * p, side * p), timestep=sigma * 1000.0,
                    encoder_hidden_states=rnd(batch, txt_tokens, c.text_embed_dim),
                    encoder_attention_mask=torch.ones(batch, txt_tokens, dtype=torch.long),
                    pooled_projections=rnd(batch, c.pooled_projection_dim),
                    guidance=torch.full((batch,), 3500.0, dtype=dtype), return_dict=False)
    raise ValueError(f"unknown family {family!r}; expected one of sd3, flux, wan, qwen_image, hunyuan_video")


def add_lora(model: torch.nn.Module, family: str, rank: int) -> None:
    """Freeze ``model`` and add the family's default LoRA adapter (``models.lora``) of ``rank``."""
    from types import SimpleNamespace

    from digenrl.models.lora import apply_lora

    apply_lora(model, SimpleNamespace(rank=rank, alpha=2.0 * rank, dropout=0.0, target_modules=None), family)


def saved_bytes(family: str, model: torch.nn.Module, img_tokens: int, txt_tokens: int, *, batch: int = 1,
                autocast_dtype=None) -> dict[str, int]:
    """Saved-for-backward bytes of one forward, per block kind (see ``saved_bytes_by_block``; a kind is named by
    the last component of its block-list path, as the memory plan names it)."""
    from digenrl.models.specs import SPECS

    kinds = {path: path.split(".")[-1] for path in SPECS[family].layer_keys.values()}
    x = transformer_inputs(family, model, batch, img_tokens, txt_tokens)
    with torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype is not None else nullcontext():
        return saved_bytes_by_block(model, lambda: model(**x)[0], kinds)


def fit_per_token(family: str, model: torch.nn.Module, *, autocast_dtype=None, img=(64, 144), txt=(16, 48)):
    """Per kind: (bytes per image token, bytes per text token, constant bytes) of one forward, from three
    forwards at (img0, txt0), (img1, txt0), (img0, txt1); the measured bytes are exactly linear in the token
    counts (flash-style attention keeps no tokens x tokens matrix)."""
    a, b, c = (saved_bytes(family, model, i, t, autocast_dtype=autocast_dtype)
               for i, t in ((img[0], txt[0]), (img[1], txt[0]), (img[0], txt[1])))
    out = {}
    for k in a:
        pi = (b.get(k, 0) - a[k]) / (img[1] - img[0])
        pt = (c.get(k, 0) - a[k]) / (txt[1] - txt[0])
        out[k] = (round(pi, 1), round(pt, 1), round(a[k] - pi * img[0] - pt * txt[0], 1))
    return out


def measure_training_peak(family: str, *, layers: dict[str, int] | None = None, lora_rank: int | None = None,
                          checkpointing: bool = False, img_tokens: int = 64, txt_tokens: int = 16, batch: int = 1,
                          autocast_dtype=None, dtype=torch.float32, shape_only: bool = False,
                          sequence_group=None) -> dict[str, float]:
    """Allocation-counted bytes of training a real-width ``family`` transformer: ``state`` (weights, grads and
    AdamW state after one chunk and one optimizer step) and ``peak`` of the next chunk's forward + backward,
    which accumulates into the existing gradients (the steady state of a chunked step); ``act = peak - state``.
    ``shape_only``: skip the matrix products' arithmetic (``AllocationCounter``); the counts are the same.
    ``sequence_group``: a torch.distributed group over which the sequence is split (``models.sequence_parallel``;
    every rank of it calls this at once): the bytes of one rank."""
    counter = AllocationCounter(shape_only=shape_only)
    with counter:
        model = build_transformer(family, layers, dtype=dtype)
        if lora_rank:
            add_lora(model, family, lora_rank)
        if sequence_group is not None:
            from digenrl.models.sequence_parallel import sequence_group as group_of, split_transformer

            split_transformer(family, model, group_of(sequence_group))
        if checkpointing:
            model.enable_gradient_checkpointing()
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        x = transformer_inputs(family, model, batch, img_tokens, txt_tokens, dtype=dtype)

        def chunk():
            with (torch.autocast("cpu", dtype=autocast_dtype, cache_enabled=not checkpointing)
                  if autocast_dtype is not None else nullcontext()):
                out = model(**x)[0]
            out.float().square().mean().backward()

        chunk()
        opt.step()
        del x  # inputs are rebuilt per chunk (they are not part of the steady state)
        x = transformer_inputs(family, model, batch, img_tokens, txt_tokens, dtype=dtype)
        state = counter.live
        counter.reset_peak()
        chunk()
        peak = counter.peak
    return {"state": float(state), "peak": float(peak), "act": float(peak - state)}
