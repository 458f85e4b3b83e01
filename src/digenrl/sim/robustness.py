"""The planner's robustness report (``digenrl plan``'s ``robustness`` section): the chosen plan's step time with its
costs scaled, uniformly and with rollout and training skewed against each other, and its neighbouring splits."""

from __future__ import annotations

from dataclasses import replace

from ..schedule import ScaledCost
from .executor import steady_step_time
from .planner import SearchResult


def scaled(cost, gen: float, train: float) -> ScaledCost:
    """``cost`` with rollout ops (denoise, VAE, reward, transfer, TAG switch) x ``gen`` and training ops (train,
    commit, publish) x ``train`` (the robustness report)."""
    return ScaledCost(cost, {"generate/generator": gen, "generate/trainer": gen, "train": train, "commit": train,
                             "publish": train})


def robustness(res: SearchResult, probe_steps: int, bts=None) -> dict:
    """Step time of the chosen plan with every op x 0.8 and x 1.2, with rollout and training skewed against each
    other (x 0.8 / x 1.2 and the reverse; and the split that is then fastest among each split's best probe), and
    of the neighbouring splits (g +- 1) probed with the same values."""
    b = res.best
    cost = res.costs[b.candidate]

    def at(p, c) -> float:
        return steady_step_time(replace(p, steps=probe_steps), c, bts=bts)

    out = {"uniform": {f"x{f:g}": at(b.plan, scaled(cost, f, f)) for f in (0.8, 1.2)}, "skewed": {}}
    for gf, tf in ((0.8, 1.2), (1.2, 0.8)):
        times = {k: at(p.plan, scaled(res.costs[p.candidate], gf, tf)) for k, p in res.best_per_split().items()}
        fastest = min(times, key=times.get)
        out["skewed"][f"rollout x{gf:g}, training x{tf:g}"] = {
            "chosen_s": times[b.candidate.split.key()], "best_split": fastest, "best_split_s": times[fastest]}
    out["neighbours"] = {p.candidate.split.key(): p.step_time for p in res.probes
                         if abs(p.candidate.split.n_gen - b.candidate.split.n_gen) == 1
                         and replace(p.candidate, split=b.candidate.split) == b.candidate}
    return out


__all__ = ["robustness", "scaled"]
