"""The generator pool's inference copy of the policy (the ``generator`` config section; docs/fast_generator.md
describes the three options, what they cost and why the copy differs from a trainer's weights).

* ``merge_lora`` (LoRA only): every peft LoRA layer merged once per published version, W = W0 + (alpha / r) B A
  (peft's ``LoraLayer.merge``), from the kept W0 every time (peft's ``unmerge`` is not exact in floating point:
  W0 + d - d != W0), so version k's weights are W0 + delta_k, rounded once.
* ``dtype``: the transformer's weights (adapters included) in an inference dtype; inputs are cast to it inside
  the policy's forward and the velocity comes back as float32 (the SDE step and the log-probs stay float32).
* ``compile``: ``nn.Module.compile`` of the transformer in place (parameter names unchanged), ``dynamic=False``,
  compiled once; every later version is swapped into the same parameter tensors in place, so the compiled graph,
  its guards (the copy stays in eval mode) and a ``reduce-overhead`` CUDA graph stay valid: no recompile
  (``tests/models/test_fast_generator.py`` counts the compilations).

The publish paths receive the trainers' tensors as they are (``layout``: each published tensor's shape and dtype,
recorded before the cast), and ``load`` casts them while copying them in.
"""

from __future__ import annotations

import torch

from digenrl.models.base import Policy
from digenrl.models.diffusers_files import DTYPES


def lora_layers(module: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """name -> peft LoRA layer of ``module`` (the layers a merge rewrites)."""
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in module.named_modules() if isinstance(m, LoraLayer)}


class FastGenerator:
    """The inference copy of ``policy`` (module docstring); ``options``: a ``config.GeneratorConfig``.
    ``backend``: a ``torch.compile`` backend to use instead of inductor (tests pass a counting one)."""

    def __init__(self, policy: Policy, options, *, backend=None):
        from digenrl.models.lora import ADAPTER

        self.policy, self.options, self.adapter = policy, options, ADAPTER
        policy.eval()  # it only samples (dropout off, as the sampler sets it): one mode, so one compiled graph
        self.layout = {n: (tuple(t.shape), t.dtype) for n, t in policy.trainable_state_dict().items()}
        net = policy.velocity_model()
        if options.dtype is not None:
            net.to(DTYPES[options.dtype])
        self.layers = lora_layers(net) if options.merge_lora else {}
        if options.merge_lora and not self.layers:
            raise ValueError("generator.merge_lora: the policy has no LoRA layers to merge")
        with torch.no_grad():
            self.base = {n: m.get_base_layer().weight.detach().clone() for n, m in self.layers.items()}
            self._merge()  # the version as built (an adapter's B starts at zero: W0 itself)
        self.compiled = options.compile != "none" or backend is not None
        if self.compiled:
            kw = {"backend": backend} if backend is not None else {
                "mode": None if options.compile == "default" else options.compile}
            net.compile(dynamic=False, **kw)

    @torch.no_grad()
    def load(self, state: dict[str, torch.Tensor]) -> None:
        """Swap a published version in, in place: W0 restored, the trainable tensors copied, the merge redone."""
        for name, layer in self.layers.items():
            if layer.merged:
                layer.unmerge()  # peft's bookkeeping; the value is overwritten with W0 next
            layer.get_base_layer().weight.copy_(self.base[name])
        self.policy.load_trainable_state_dict(state)
        self._merge()

    def _merge(self) -> None:
        for layer in self.layers.values():
            layer.merge(adapter_names=[self.adapter])
