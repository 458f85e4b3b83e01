"""Achievable share of a GPU's dense BF16 peak, fitted to cited public step-time measurements.

For a transformer forward over ``x`` tokens (all samples of the batch together) on GPU ``g``::

    eff_g(x) = plateau_g * x / (x + half_tokens)

``plateau_g`` is fitted per GPU kind to the public end-to-end measurements below: for measurement i
(``steps`` denoising steps of one sample, FLOPs F_i from ``models.flops``, the VAE decode priced at
``conv_fraction`` of peak and subtracted), the achieved model-FLOP utilisation is
``mfu_i = F_i / ((t_i - vae_i) * peak_g)``; ``plateau_g = exp(mean_i log(mfu_i / sat(x_i)))`` over the kind's
measurements. A GPU kind without a measurement (the L40S: none found) takes the log-log regression of the
fitted plateaus on the kind's compute-to-bandwidth ratio (peak FLOP/s per HBM byte/s): the measurements show
that the compute-starved parts (H20, L20) reach a larger share of their small peak than the H100 does.

Not measured (stated assumptions, not fits): ``half_tokens`` (512), the VAE/reward efficiency (0.35 of
peak), the 3 ms launch overhead per forward, and training efficiency (forward+backward priced at the same
efficiency as inference: no public training step time of these models was found).

``residuals()`` prices every measurement with the fitted efficiencies (and, for the GPU kinds, with the
regression alone, leaving the kind's own measurements out) and returns model / measured - 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from .presets import A100, GPU, H100, H20, H200, L20, MODELS

HALF_TOKENS = 512.0
CONV_FRACTION = 0.35
OVERHEAD_S = 0.003


@dataclass(frozen=True)
class Measurement:
    model: str          # a model.kind (key of presets.MODELS)
    gpu: GPU
    width: int
    height: int
    frames: int
    steps: int
    forwards_per_step: int
    text_tokens: int
    seconds: float      # end-to-end generation of one sample (batch 1)
    source: str


MEASUREMENTS: tuple[Measurement, ...] = (
    # github.com/varadrane1707/BenchmarkFlux README: FLUX.1-dev, diffusers pipeline, 1024x1024, 28 steps,
    # guidance 3.5, batch 1, BF16 row: H100 7.11 s, A100 15.65 s (end to end).
    Measurement("flux", H100, 1024, 1024, 1, 28, 1, 512, 7.11, "varadrane1707/BenchmarkFlux README (BF16)"),
    Measurement("flux", A100, 1024, 1024, 1, 28, 1, 512, 15.65, "varadrane1707/BenchmarkFlux README (BF16)"),
    # github.com/xdit-project/xDiT docs/performance/hunyuanvideo.md, 1 GPU column: 129 frames, 50 steps;
    # H100/H20 with the official HunyuanVideo repository, L20 with diffusers + flash-attn 2.7.2.
    Measurement("hunyuan_video", H100, 1280, 720, 129, 50, 1, 256, 1904.08, "xDiT docs/performance/hunyuanvideo.md"),
    Measurement("hunyuan_video", H20, 1280, 720, 129, 50, 1, 256, 6639.17, "xDiT docs/performance/hunyuanvideo.md"),
    Measurement("hunyuan_video", L20, 1280, 720, 129, 50, 1, 256, 6043.88, "xDiT docs/performance/hunyuanvideo.md"),
    Measurement("hunyuan_video", H100, 960, 960, 129, 50, 1, 256, 1735.01, "xDiT docs/performance/hunyuanvideo.md"),
    Measurement("hunyuan_video", H20, 960, 960, 129, 50, 1, 256, 6621.46, "xDiT docs/performance/hunyuanvideo.md"),
    Measurement("hunyuan_video", L20, 960, 960, 129, 50, 1, 256, 6039.08, "xDiT docs/performance/hunyuanvideo.md"),
    # github.com/ModelTC/lightx2v docs benchmark (H200): Wan2.1-I2V-14B 480P 5 s (81 frames), 40 steps with
    # CFG, "Wan2.1 Official" inference time 366.04 s. Priced as the T2V-14B (the I2V image cross-attention over
    # 257 CLIP tokens adds ~0.1 % of the FLOPs).
    Measurement("wan", H200, 832, 480, 81, 40, 2, 512, 366.04, "ModelTC/lightx2v docs benchmark (H200)"),
)


def _tokens(m: Measurement) -> int:
    return MODELS[m.model].spec.latent_tokens(m.height, m.width, m.frames)


def sat(tokens: float) -> float:
    return tokens / (tokens + HALF_TOKENS)


def transformer_flops(m: Measurement) -> float:
    return m.steps * m.forwards_per_step * MODELS[m.model].archi.forward_flops(_tokens(m), m.text_tokens)


def vae_seconds(m: Measurement) -> float:
    flops = MODELS[m.model].spec.vae_flop_per_px * m.width * m.height * m.frames
    return flops / (m.gpu.bf16_tflops * 1e12 * CONV_FRACTION)


def achieved_mfu(m: Measurement) -> float:
    return transformer_flops(m) / ((m.seconds - vae_seconds(m)) * m.gpu.bf16_tflops * 1e12)


def ratio(gpu: GPU) -> float:
    """Peak FLOP per byte of memory bandwidth."""
    return gpu.bf16_tflops * 1e12 / (gpu.hbm_gbs * 1e9)


def _fit(ms) -> dict[str, tuple[float, GPU]]:
    by: dict[str, list] = {}
    for m in ms:
        by.setdefault(m.gpu.name, []).append(m)
    return {k: (math.exp(sum(math.log(achieved_mfu(m) / sat(_tokens(m))) for m in v) / len(v)), v[0].gpu)
            for k, v in by.items()}


def line_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(a, b) of the least-squares line y = a + b x (b = 0 when every x is the same)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    return my - b * mx, b


def _regression(plateaus: dict[str, tuple[float, GPU]]) -> tuple[float, float]:
    """Least squares of log(plateau) = a + b log(ratio) over the fitted kinds."""
    return line_fit([math.log(ratio(g)) for _, g in plateaus.values()], [math.log(p) for p, _ in plateaus.values()])


@lru_cache(maxsize=1)
def fitted() -> tuple[dict[str, tuple[float, GPU]], tuple[float, float]]:
    plateaus = _fit(MEASUREMENTS)
    return plateaus, _regression(plateaus)


def plateau(gpu: GPU) -> tuple[float, str]:
    """(plateau, how it was obtained) for ``gpu``: its own fit, else the regression on its FLOP/byte ratio."""
    plateaus, (a, b) = fitted()
    if gpu.name in plateaus:
        n = sum(1 for m in MEASUREMENTS if m.gpu.name == gpu.name)
        return plateaus[gpu.name][0], f"fitted to {n} measurement{'s' if n > 1 else ''}"
    return min(0.9, math.exp(a + b * math.log(ratio(gpu)))), "regression on FLOP/byte (no measurement)"


@dataclass(frozen=True)
class Efficiency:
    plateau: float
    half_tokens: float = HALF_TOKENS
    conv_fraction: float = CONV_FRACTION   # VAE convolutions and reward models (assumed)
    overhead_s: float = OVERHEAD_S         # per forward: kernel launches, host sync (assumed)
    reserve_gb: float = 3.0                # CUDA context, allocator fragmentation, VAE / reward weights

    def __call__(self, tokens: float) -> float:
        return self.plateau * tokens / (tokens + self.half_tokens)


def efficiency_for(gpu: GPU) -> Efficiency:
    return Efficiency(plateau(gpu)[0])


def predicted_seconds(m: Measurement, plateau_value: float) -> float:
    fwd = transformer_flops(m) / m.steps / m.forwards_per_step
    per_fwd = fwd / (m.gpu.bf16_tflops * 1e12 * plateau_value * sat(_tokens(m))) + OVERHEAD_S
    return m.steps * m.forwards_per_step * per_fwd + vae_seconds(m)


def residuals() -> list[dict]:
    """Every measurement priced with its kind's fitted plateau and with the leave-kind-out regression."""
    plateaus, _ = fitted()
    out = []
    for m in MEASUREMENTS:
        others = {k: v for k, v in plateaus.items() if k != m.gpu.name}
        a, b = _regression(others)
        loo = min(0.9, math.exp(a + b * math.log(ratio(m.gpu))))
        fit = plateaus[m.gpu.name][0]
        out.append({"model": m.model, "gpu": m.gpu.name, "shape": f"{m.width}x{m.height}x{m.frames}",
                    "steps": m.steps, "measured_s": m.seconds, "mfu": achieved_mfu(m), "plateau": fit,
                    "predicted_s": predicted_seconds(m, fit), "residual": predicted_seconds(m, fit) / m.seconds - 1,
                    "loo_predicted_s": predicted_seconds(m, loo),
                    "loo_residual": predicted_seconds(m, loo) / m.seconds - 1, "source": m.source})
    return out
