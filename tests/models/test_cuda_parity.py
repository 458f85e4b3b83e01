"""CUDA against CPU (GPU-marked: skipped without a GPU; `benchmarks/gpu_acceptance.sh` runs them).

Oracle: the same float32 computation on the CPU. The SDE step's log-prob (the quantity the loss ratios come
from) and one policy forward + backward of the built-in model must agree to float32 rounding.
"""

from __future__ import annotations

import os

import pytest
import torch

DEV = os.environ.get("DIGENRL_PARITY_DEVICE", "cuda")  # "cpu" checks the test itself on a machine without one
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(DEV.startswith("cuda") and not torch.cuda.is_available(), reason="needs CUDA")]


def test_sde_logprob_on_cuda_equals_cpu():
    from digenrl.algo.sde import sde_step_with_logprob

    g = torch.Generator().manual_seed(0)
    x, v, eps = (torch.randn(4, 4, 8, 8, generator=g) for _ in range(3))
    for kind in ("flow_grpo", "dance", "cps"):
        cpu = sde_step_with_logprob(x, v, 0.7, 0.55, noise_level=0.7, kind=kind, noise=eps)
        gpu = sde_step_with_logprob(x.to(DEV), v.to(DEV), 0.7, 0.55, noise_level=0.7, kind=kind, noise=eps.to(DEV))
        torch.testing.assert_close(gpu.prev_sample.cpu(), cpu.prev_sample, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(gpu.log_prob.cpu(), cpu.log_prob, rtol=1e-4, atol=1e-5)


def test_tiny_dit_forward_backward_on_cuda_equals_cpu():
    from digenrl.config import Config
    from digenrl.models.registry import build_policy

    torch.manual_seed(0)
    cpu = build_policy(Config().model)
    gpu = build_policy(Config().model)
    gpu.load_trainable_state_dict(cpu.trainable_state_dict())
    gpu.to(DEV)
    from digenrl.tasks.digits import make_prompt

    prompts = [make_prompt(4, 10), make_prompt(10, 7)]
    cond = cpu.encode_prompts(prompts)
    x = torch.randn(2, *cpu.latent_shape)
    sigma = torch.tensor([0.9, 0.4])
    out_c = cpu(x, sigma, cond)
    out_g = gpu(x.to(DEV), sigma.to(DEV), gpu.encode_prompts(prompts))
    torch.testing.assert_close(out_g.cpu(), out_c, rtol=1e-4, atol=1e-5)
    out_c.square().mean().backward()
    out_g.square().mean().backward()
    grads = [(n, p) for n, p in cpu.named_parameters() if p.requires_grad]
    other = dict(gpu.named_parameters())
    assert grads
    for n, pc in grads:
        torch.testing.assert_close(other[n].grad.cpu(), pc.grad, rtol=1e-3, atol=1e-6, msg=n)
