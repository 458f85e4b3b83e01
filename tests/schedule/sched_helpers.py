"""Shared helpers of the scheduler tests: a linear cost model and a plan builder."""

from __future__ import annotations

from dataclasses import dataclass, field

from digenrl.schedule import StepPlan


@dataclass
class LinCost:
    """time(op, b, pool) = fixed + per_item * b, times ``trainer_factor`` on the trainer pool for generation
    ops (a heterogeneous cluster)."""

    coef: dict[str, tuple[float, float]] = field(default_factory=dict)
    trainer_factor: float = 1.0

    def time(self, op: str, batch: int, pool: str) -> float:
        fixed, per = self.coef.get(op, (0.0, 0.0))
        t = fixed + per * batch
        if pool == "trainer" and op in ("denoise", "vae_decode", "reward"):
            t *= self.trainer_factor
        return t


def make_plan(mode: str, *, prompts=2, generations=4, fragment_size=2, S=2, T=3, cg=2, cs=1, n_gen=2,
              n_train=2, steps=2, stale=0.5, minibatches=1, epochs=1, shard_ranks=1, publish_joins=False,
              gang_groups=True, publish_streams=False) -> StepPlan:
    """``publish_streams`` implies ``publish_joins`` (a streamed publish is joined by the generators)."""
    gens = () if mode == "colocated" else tuple(f"g{i}" for i in range(n_gen))
    return StepPlan(prompts=prompts, generations=generations, fragment_size=fragment_size, trained_timesteps=S,
                    sampling_steps=T, chunk_generations=cg, chunk_timesteps=cs, generators=gens,
                    trainers=tuple(f"t{i}" for i in range(n_train)), mode=mode, steps=steps,
                    max_stale_fraction=stale, minibatches=minibatches, epochs=epochs, shard_ranks=shard_ranks,
                    publish_joins=(publish_joins or publish_streams) and mode != "colocated", gang_groups=gang_groups,
                    publish_streams=publish_streams and mode != "colocated")
