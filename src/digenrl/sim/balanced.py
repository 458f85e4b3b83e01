"""Colocation over a heterogeneous cluster that load-balances over both GPU kinds, and prices per GPU-hour.

**Load-balanced colocation** (an idealised bound, analytic: the scheduler's colocated mode gives every rank
the same share). All N = sum n_k GPUs form one colocated FSDP job (parameters, master weights and moments
sharded over all N, collectives over all of them: ``sim.comm``); each kind k takes a share of the step's
generations and of its training cells proportional to its speed, so both phases end on every kind at once::

    r_gen(k)   = n_k x f_k / G_k(f_k)        samples per second of kind k, G_k(f) = T denoise(f) + decode(f)
                                             + reward(f) on one rank, f_k the fastest per sample that fits
    r_train(k) = n_k x c / C_k(c)            cells per second, C_k(c) = train_chunk(c) on one rank, c = ceil(B / N)
                                             (the scheduler's colocated chunk: one timestep x a rank's batch)
    step       = B / sum_k r_gen(k) + B S / sum_k r_train(k) + max_k switch_k + max_k commit_k

(the work is divided continuously: no rounding of samples or cells onto ranks, so this is a bound a real
load balancer can only approach). On one kind it is the idle-free colocated step of that kind.

**Prices** (``GPU_HOUR_USD``): on-demand list prices per GPU-hour, named with their source; a comparison at
equal cost divides each setup's step time by the GPU-hours per hour it rents:
``speedup at equal cost = (step_b x cost_b) / (step_full x cost_full)``, ``cost = sum_k n_k x price_k``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..schedule.cost import TRAINER
from .assumptions import DEFAULT, Assumptions
from .presets import GPU, H20, H100, L40S, ModelPreset, Testbed, Workload
from .roofline import InfeasibleError, RooflineCost

# On-demand list prices, USD per GPU-hour (us-east-1):
# * L40S: AWS EC2 g6e.48xlarge (8 x L40S) $30.131 per hour -> 3.766 per GPU-hour.
# * H100: AWS EC2 p5.48xlarge (8 x H100 SXM) $98.32 per hour -> 12.29 per GPU-hour (the list price before
#   AWS's June 2025 price cut for P5 instances).
# * H20: no public cloud list price was found (the part is sold for the Chinese market); ASSUMED equal to the
#   L40S's per GPU-hour. The where-wins page also gives the break-even H20 price of each comparison.
GPU_HOUR_USD: dict[str, tuple[float, str]] = {
    L40S.name: (30.131 / 8, "AWS EC2 g6e.48xlarge on-demand, $30.131/h for 8 L40S"),
    H100.name: (98.32 / 8, "AWS EC2 p5.48xlarge on-demand, $98.32/h for 8 H100 (list price before June 2025)"),
    H20.name: (30.131 / 8, "assumed equal to the L40S's (no public list price found)"),
}


def gpu_hour_usd(gpu: GPU) -> float:
    try:
        return GPU_HOUR_USD[gpu.name][0]
    except KeyError:
        raise KeyError(f"no GPU-hour price for {gpu.name} (sim.balanced.GPU_HOUR_USD)") from None


def break_even_price(step_b: float, counts_b: list[tuple[GPU, int]], step_full: float,
                     counts_full: list[tuple[GPU, int]], unknown: GPU) -> float:
    """The price of ``unknown`` per GPU-hour at which both setups cost the same per step (the other kinds at
    their listed prices): solve step_b x cost_b(p) = step_full x cost_full(p) for p."""
    def split(counts):
        known = sum(n * gpu_hour_usd(g) for g, n in counts if g.name != unknown.name)
        return known, sum(n for g, n in counts if g.name == unknown.name)
    kb, ub = split(counts_b)
    kf, uf = split(counts_full)
    denom = step_full * uf - step_b * ub
    if denom == 0:
        return float("inf")
    return (step_b * kb - step_full * kf) / denom


@dataclass(frozen=True)
class KindRates:
    gpu: GPU
    count: int
    gen_per_s: float     # samples per second of the kind's n_k ranks
    cells_per_s: float   # training cells per second of the kind's n_k ranks
    switch_s: float
    commit_s: float


def kind_rates(model: ModelPreset, workload: Workload, testbed: Testbed, gpu: GPU, count: int, total: int,
               assume: Assumptions = DEFAULT) -> KindRates:
    """Rates of ``count`` ranks of ``gpu`` in a colocated job of ``total`` ranks (module docstring)."""
    c = RooflineCost(model, workload, testbed, 0, total, colocated=True, train_gpu=gpu, assume=assume)
    w = workload
    fits = [f for f in range(1, w.generations + 1) if f <= c.max_fragment] or [1]

    def gen(f: int) -> float:
        return (w.denoise_steps * c.time("denoise", f, TRAINER) + c.time("vae_decode", f, TRAINER)
                + c.time("reward", f, TRAINER))
    f = min(fits, key=lambda f: gen(f) / f)
    k = -(-w.prompts * w.generations // total)  # the colocated layout's chunk: one timestep x a rank's local batch
    return KindRates(gpu, count, count * f / gen(f), count * k / c.time("train_chunk", k, TRAINER),
                     c.time("tag_switch", 1, TRAINER),
                     c.time("allreduce", 1, TRAINER) + c.time("optimizer", 1, TRAINER))


def balanced_step(rates: list[KindRates], workload: Workload) -> float:
    """B / sum r_gen + B S / sum r_train + max switch + max commit (module docstring)."""
    b = workload.prompts * workload.generations
    return (b / sum(r.gen_per_s for r in rates) + b * workload.trained_timesteps / sum(r.cells_per_s for r in rates)
            + max(r.switch_s for r in rates) + max(r.commit_s for r in rates))


def load_balanced_colocated(model: ModelPreset, workload: Workload, testbed: Testbed,
                            assume: Assumptions = DEFAULT) -> dict:
    """The load-balanced colocated step over every GPU of ``testbed`` (both kinds), or the reason it does not fit."""
    kinds = [(testbed.gpu, testbed.count)] + ([(testbed.gpu2, testbed.count2)] if testbed.gpu2 else [])
    try:
        rates = [kind_rates(model, workload, testbed, g, n, testbed.total, assume) for g, n in kinds]
    except InfeasibleError as e:
        return {"error": str(e)}
    step = balanced_step(rates, workload)
    gen_total = sum(r.gen_per_s for r in rates)
    return {"step_s": step, "gpus": testbed.total,
            "gen_share": {r.gpu.name: r.gen_per_s / gen_total for r in rates},
            "train_share": {r.gpu.name: r.cells_per_s / sum(x.cells_per_s for x in rates) for r in rates}}


__all__ = ["GPU_HOUR_USD", "KindRates", "balanced_step", "break_even_price", "gpu_hour_usd", "kind_rates",
           "load_balanced_colocated"]
