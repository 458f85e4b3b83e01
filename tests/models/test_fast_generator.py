"""The generator pool's inference copy (``models.fast_generator``) against the eager, unmerged float32 path.

Each option is checked on a FLUX-architecture diffusers model with random weights and a LoRA adapter
(``tiny_diffusers.save_flux``) and, where it applies, on the built-in tiny DiT (no LoRA): the velocity at the same
inputs, and the sampler's trajectories (samples, recorded log-probs) over several published versions.

Tolerances: LoRA merged in float32 only reassociates W x + s B (A x) into (W + s B A) x, so the velocities agree to
float32 rounding (1e-5 relative). torch.compile in float32 fuses and reorders float32 operations: 1e-5 relative.
bfloat16 keeps 8 significant bits (unit roundoff u = 2^-9 ~ 2e-3) in every weight and activation; a forward of
these models chains about 15 rounded stages (embeddings, each block's projections, norms, attention, residual
sums), so its velocity is within ~15 u ~ 3e-2 of the float32 one (measured: 8e-3 tiny DiT, 6e-3 FLUX). On FLUX
the float32 oracle is evaluated at the timestep and guidance a bf16 FLUX embeds: diffusers casts both to the
weights' dtype before scaling them by 1000 (``bf16_embedded``: guidance 3.5 becomes 3.504), which alone moves
this random model's velocity by 5% (a real property of bf16 FLUX inference, seen by the mismatch metrics). The
log-probs a bf16 generator records are float32 and exact for its own transitions; what bf16 changes is the
trainer's log-prob of them (mismatch d = logp_gen - logp_trainer, ~eps . delta_mean / std per dimension, averaged
over the latent): measured |d| <= 4e-3, checked <= 2e-2. One sampler step from the same noise moves by the
velocity error times |dt| (checked <= 3e-2); over the T steps the samples drift further (measured 0.6% on the
tiny DiT, 5-15% on the random FLUX with a large random adapter, whose trajectories are chaotic), so the final
samples are not compared in bf16.
"""

from __future__ import annotations

import copy

import pytest
import torch

import tiny_diffusers as td
from digenrl.algo.timesteps import select_timesteps
from digenrl.config import GeneratorConfig, LoraConfig, ModelConfig
from digenrl.models.fast_generator import FastGenerator
from digenrl.models.registry import build_policy
from digenrl.rollout.records import Prompt
from digenrl.rollout.sampler import SamplerSettings, sample_trajectories

FLUX_PROMPTS = [Prompt(0, "a red cat"), Prompt(1, "a big dog")]
DIGIT_PROMPTS = [Prompt(i, "", {"left": i, "right": (3 * i) % 10}) for i in range(4)]
RANK, ALPHA = 4, 8.0


@pytest.fixture(scope="module")
def flux_dir(tmp_path_factory):
    return td.save_flux(tmp_path_factory.mktemp("flux") / "model")


def flux(path):
    torch.manual_seed(0)
    return build_policy(ModelConfig(kind="flux", path=str(path), lora=LoraConfig(enabled=True, rank=RANK, alpha=ALPHA),
                                    options={"height": 16, "width": 16, "max_sequence_length": 8}))


def tiny_dit():
    from digenrl.models.tiny_dit import TinyDiTConfig, TinyDiTPolicy

    torch.manual_seed(0)
    return TinyDiTPolicy(TinyDiTConfig(dim=32, depth=2, heads=2))


def versions(policy, n: int, seed: int = 1):
    """n published states: random adapters (LoRA) or the weights moved by noise (full fine-tuning)."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        yield {k: (0.3 * torch.randn(t.shape, generator=g) if "lora_" in k else t + 0.05 * torch.randn(t.shape, generator=g))
               for k, t in policy.trainable_state_dict().items()}


def inputs(policy, prompts):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(len(prompts), *policy.latent_shape, generator=g)
    return x, torch.rand(len(prompts), generator=g) * 0.9 + 0.05, policy.encode_prompts(prompts)


def velocity(policy, x, s, cond, guidance=3.5):
    with torch.no_grad():
        return policy(x, s, cond, guidance=guidance)


def bf16_embedded(value):
    """What diffusers' FLUX embeds for a timestep / guidance value v when its weights are bf16: it casts v to the
    weights' dtype and multiplies by 1000 there (``FluxTransformer2DModel.forward``), so round(round(v) 1000) / 1000
    (guidance 3.5 becomes 3.504)."""
    v = torch.as_tensor(value, dtype=torch.float32)
    return (v.to(torch.bfloat16) * 1000).float() / 1000


def trajectories(policy, prompts, steps=4):
    cfg = 3.5 if policy.uses_guidance_embedding else 1.0
    return sample_trajectories(policy, prompts, list(range(len(prompts))), step=0, run_seed=0, version=0,
                               settings=SamplerSettings(num_steps=steps, noise_level=0.7, cfg_scale=cfg),
                               plan=select_timesteps(steps, fraction=0.99), decode=False)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def trainer_logp(policy, batch) -> torch.Tensor:
    """The float32 eager policy's log-probs of ``batch``'s recorded transitions (the trainer's view)."""
    from digenrl.train.chunk_loss import LossSettings, cell_forward

    S = len(batch.trained_steps)
    rows, tpos = torch.arange(len(batch)).repeat_interleave(S), torch.arange(S).repeat(len(batch))
    cfg = 3.5 if policy.uses_guidance_embedding else 1.0
    with torch.no_grad():
        f = cell_forward(policy, batch, rows, tpos, settings=LossSettings(cfg_scale=cfg, guidance=cfg, noise_level=0.7))
    return (batch.log_probs[rows, tpos] - f.out.log_prob).abs()


# ---- merge_lora -------------------------------------------------------------------------------------------------
def test_merge_matches_the_unmerged_adapters_over_versions(flux_dir):
    from peft.tuners.lora import LoraLayer

    eager, merged = flux(flux_dir), flux(flux_dir)
    fast = FastGenerator(merged, GeneratorConfig(merge_lora=True))
    assert len(fast.layers) > 0 and all(isinstance(m, LoraLayer) for m in fast.layers.values())
    x, s, cond = inputs(eager, FLUX_PROMPTS)
    for state in versions(eager, 3):
        eager.load_trainable_state_dict(state)
        fast.load(state)
        v0, v1 = velocity(eager, x, s, cond), velocity(merged, x, s, cond)
        assert rel(v1, v0) < 1e-5
        assert rel(v0, velocity(flux(flux_dir), x, s, cond)) > 1e-2  # (the version really changes the model)
        # the weight is W0 + (alpha / r) B A, written here from the formula, not with peft
        base = dict(flux(flux_dir).transformer.named_parameters())
        for name, layer in fast.layers.items():
            A, B = state[f"transformer.{name}.lora_A.default.weight"], state[f"transformer.{name}.lora_B.default.weight"]
            want = base[f"{name}.base_layer.weight"] + (ALPHA / RANK) * B @ A
            torch.testing.assert_close(layer.get_base_layer().weight, want, rtol=1e-6, atol=1e-6)
        a, b = trajectories(eager, FLUX_PROMPTS), trajectories(merged, FLUX_PROMPTS)
        assert rel(b.final, a.final) < 1e-5 and rel(b.latents, a.latents) < 1e-5
        torch.testing.assert_close(b.log_probs, a.log_probs, rtol=1e-5, atol=1e-5)
        assert float(trainer_logp(eager, b).max()) < 1e-5  # the trainer's log-probs of the merged samples


def test_merged_forward_runs_no_adapter_matmul(flux_dir):
    merged = flux(flux_dir)
    fast = FastGenerator(merged, GeneratorConfig(merge_lora=True))
    fast.load(next(versions(merged, 1)))
    x, s, cond = inputs(merged, FLUX_PROMPTS)
    v = velocity(merged, x, s, cond)
    with torch.no_grad():
        for n, p in merged.named_parameters():
            if "lora_" in n:
                p.fill_(float("nan"))  # an adapter matmul would turn the output into NaN
    torch.testing.assert_close(velocity(merged, x, s, cond), v)


def test_merge_is_rebuilt_from_the_base_every_version(flux_dir):
    """30 versions loaded one after another leave exactly the weights one load of the last version gives: the merge
    does not accumulate W0 + d1 - d1 + d2 - ... rounding."""
    many, once = flux(flux_dir), flux(flux_dir)
    fast_many = FastGenerator(many, GeneratorConfig(merge_lora=True))
    states = list(versions(many, 30, seed=3))
    for state in states:
        fast_many.load(state)
    FastGenerator(once, GeneratorConfig(merge_lora=True)).load(states[-1])
    w_many, w_once = dict(many.transformer.named_parameters()), dict(once.transformer.named_parameters())
    assert all(torch.equal(w_many[k], w_once[k]) for k in w_once)


# ---- dtype -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["tiny_dit", "flux"])
def test_bf16_copy_within_bf16_rounding(model, flux_dir):
    eager = tiny_dit() if model == "tiny_dit" else flux(flux_dir)
    half = copy.deepcopy(eager)
    fast = FastGenerator(half, GeneratorConfig(dtype="bfloat16"))
    assert all(p.dtype == torch.bfloat16 for p in half.velocity_model().parameters())
    assert set(fast.layout) == set(eager.trainable_state_dict()) and all(d == torch.float32 for _, d in fast.layout.values())
    prompts = FLUX_PROMPTS if model == "flux" else DIGIT_PROMPTS
    x, s, cond = inputs(eager, prompts)
    for state in versions(eager, 2):
        eager.load_trainable_state_dict(state)
        fast.load(state)  # float32 tensors cast while copied in
        v1 = velocity(half, x, s, cond)
        v0 = velocity(eager, x, s, cond) if model == "tiny_dit" else \
            velocity(eager, x, bf16_embedded(s), cond, float(bf16_embedded(3.5)))
        assert v1.dtype == torch.float32 and 1e-4 < rel(v1, v0) < 3e-2
        a, b = trajectories(eager, prompts), trajectories(half, prompts)
        assert b.log_probs.dtype == torch.float32 and b.final.dtype == torch.float32
        assert rel(b.next_latents[:, 0], a.next_latents[:, 0]) < 3e-2  # one step from the same noise
        assert float(trainer_logp(eager, b).max()) < 2e-2


def test_publish_receives_the_trainers_dtype(flux_dir):
    from digenrl.runtime.publish import _receive_like

    half = flux(flux_dir)
    fast = FastGenerator(half, GeneratorConfig(dtype="bfloat16"))
    like = _receive_like(half, fast.layout)
    assert like and all(dtype == torch.float32 for _, dtype, _ in like.values())  # as the trainers send them
    assert all(t.dtype == torch.bfloat16 for t in half.trainable_state_dict().values())  # held in bf16


# ---- compile ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["tiny_dit", "flux_merged_bf16"])
def test_compiled_once_across_version_swaps(model, flux_dir):
    """A counting backend (the graphs run as captured): one compilation, then >= 3 versions swapped in place
    without a recompile, each giving the velocity of the same copy uncompiled."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    eager = tiny_dit() if model == "tiny_dit" else flux(flux_dir)
    live, plain = copy.deepcopy(eager), copy.deepcopy(eager)
    opts = GeneratorConfig() if model == "tiny_dit" else GeneratorConfig(merge_lora=True, dtype="bfloat16")
    counter = CompileCounter()
    fast, uncompiled = FastGenerator(live, opts, backend=counter), FastGenerator(plain, opts)
    x, s, cond = inputs(eager, FLUX_PROMPTS if model != "tiny_dit" else DIGIT_PROMPTS)
    where = {n: p.data_ptr() for n, p in live.named_parameters()}  # (a CUDA graph replays these addresses)
    for i, state in enumerate(versions(eager, 4)):
        fast.load(state)
        uncompiled.load(state)
        assert rel(velocity(live, x, s, cond), velocity(plain, x, s, cond)) < 1e-5
        assert counter.frame_count == 1, f"recompiled at version {i}"
        assert {n: p.data_ptr() for n, p in live.named_parameters()} == where  # swapped in place
    assert counter.op_count > 0


@pytest.mark.parametrize("model", ["tiny_dit", "flux"])
def test_inductor_compile_matches_eager(model, flux_dir):
    """generator.compile=default (inductor), float32: trajectories within 1e-5 of the eager path over 3 versions, and
    one graph for all of them."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    eager = tiny_dit() if model == "tiny_dit" else flux(flux_dir)
    live = copy.deepcopy(eager)
    opts = GeneratorConfig(compile="default", merge_lora=model == "flux")
    fast = FastGenerator(live, opts)
    prompts = FLUX_PROMPTS if model == "flux" else DIGIT_PROMPTS
    graphs = []
    for state in versions(eager, 3):
        eager.load_trainable_state_dict(state)
        fast.load(state)
        a, b = trajectories(eager, prompts), trajectories(live, prompts)
        assert rel(b.final, a.final) < 1e-5 and rel(b.latents, a.latents) < 1e-5
        torch.testing.assert_close(b.log_probs, a.log_probs, rtol=1e-5, atol=1e-5)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] >= 1 and graphs == [graphs[0]] * 3, graphs
