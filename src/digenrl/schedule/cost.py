"""The cost-model interface: per-operation seconds as a function of batch size and pool.

Both executors and BTS price an action with ``Durations`` (one formula, so that with exact costs BTS predicts
the simulated times to the last bit). A cost model only has to answer ``time(op, batch, pool)``:

=============  ==================================================  =================================
op             meaning                                             batch
=============  ==================================================  =================================
denoise        one denoising step of the transformer (incl. CFG)   generations
vae_decode     decode final latents to pixels                      generations
reward         score decoded samples                               generations
transfer       move trajectories (latents, log-probs) to trainers  generations
train_chunk    forward + backward of one packed chunk              cells (generation x timestep)
allreduce      gradient synchronisation at the commit              1
optimizer      optimizer step                                      1
publish        push the new weights to the generator pool          1
tag_switch     trainer rank builds its inference copy (TAG)        1
=============  ==================================================  =================================

``pool`` is ``"generator"`` or ``"trainer"`` (heterogeneous clusters: the pools can be different GPUs; TAG
and colocated generation run the generation ops on the trainer pool).

Action durations (seconds)::

    Generate(n gens) = T * denoise(n) + vae_decode(n) + reward(n) + transfer(n)
                       (in batches of at most ``plan.sample_batch``: ``fragment_seconds``)
                       (transfer in every mode: the runtime's colocated workers also hand trajectories over
                       through the object store; a cost model of an in-process colocated system prices it 0)
                       + tag_switch(1) [if action.switch]
    Train(c cells)   = train_chunk(c)
    Commit           = allreduce(1) + optimizer(1)
                       + publish(1) on the trainer pool [a step's final commit, ``plan.publish_streams``:
                       the trainers' shard sends, which then run beside their work]
    Publish          = publish(1)            (0 in colocated mode: nothing to send; priced on the trainer
                       pool, or on the generator pool with ``plan.publish_streams``: what the generators
                       receive and load while the trainers go on)
"""

from __future__ import annotations

from enum import Enum
from typing import Protocol, runtime_checkable

from .actions import Action, Commit, Generate, Publish, Train
from .plan import StepPlan

GENERATOR = "generator"
TRAINER = "trainer"
POOLS = (GENERATOR, TRAINER)


class Op(str, Enum):
    DENOISE = "denoise"
    VAE_DECODE = "vae_decode"
    REWARD = "reward"
    TRANSFER = "transfer"
    TRAIN_CHUNK = "train_chunk"
    ALLREDUCE = "allreduce"
    OPTIMIZER = "optimizer"
    PUBLISH = "publish"
    TAG_SWITCH = "tag_switch"


OPS: tuple[str, ...] = tuple(o.value for o in Op)


@runtime_checkable
class CostModel(Protocol):
    """Seconds of one operation over ``batch`` items on a GPU of ``pool``."""

    def time(self, op: str, batch: int, pool: str) -> float: ...


def fragment_seconds(cost: CostModel, sampling_steps: int, size: int, pool: str, batch: int | None = None) -> float:
    """A fragment of ``size`` generations on ``pool`` without a switch, sampled and scored in batches of at most
    ``batch`` (None: one batch), as ``train.step_math.generate`` does::

        q, r = divmod(size, b)      seconds = q x s(b) + s(r) + transfer(size),   s(n) = T denoise(n) + vae_decode(n)
                                                                                        + reward(n),   s(0) = 0
    """
    t = cost.time

    def sampled(n: int) -> float:
        return (sampling_steps * t(Op.DENOISE.value, n, pool) + t(Op.VAE_DECODE.value, n, pool)
                + t(Op.REWARD.value, n, pool)) if n else 0.0

    b = min(batch or size, size) or 1
    q, r = divmod(size, b)
    return q * sampled(b) + sampled(r) + t(Op.TRANSFER.value, size, pool)


class Durations:
    """Prices actions of one plan with one cost model (memoized by shape, never by identity)."""

    def __init__(self, plan: StepPlan, cost: CostModel):
        self.plan = plan
        self.cost = cost
        self._cache: dict[tuple, float] = {}
        self._trainers = frozenset(plan.trainers)  # ``plan.is_trainer``

    def _memo(self, key: tuple, what: str, seconds) -> float:
        d = self._cache.get(key)
        if d is None:
            self._cache[key] = d = _check(seconds(), what)
        return d

    def generate(self, size: int, on_trainer: bool, switch: bool) -> float:
        key = ("g", size, on_trainer, switch)
        d = self._cache.get(key)  # (``_memo`` inlined: the simulator's hot path)
        if d is None:  # the fragment's seconds and the switch's are each priced once (with and without a switch)
            fkey = ("f", size, on_trainer)
            f = self._cache.get(fkey)
            if f is None:
                self._cache[fkey] = f = fragment_seconds(self.cost, self.plan.sampling_steps, size,
                                                         TRAINER if on_trainer else GENERATOR, self.plan.sample_batch)
            if switch:
                sw = self._cache.get(("s",))
                if sw is None:
                    self._cache[("s",)] = sw = self.cost.time(Op.TAG_SWITCH.value, 1, TRAINER)
            self._cache[key] = d = _check(f + (sw if switch else 0.0), "Generate")
        return d

    def train(self, cells: int) -> float:
        key = ("t", cells)
        d = self._cache.get(key)  # (``_memo`` inlined: the simulator's hot path)
        if d is None:
            self._cache[key] = d = _check(self.cost.time(Op.TRAIN_CHUNK.value, cells, TRAINER), "Train")
        return d

    def commit(self, final: bool = False) -> float:
        """A commit; ``final`` (the step's last) adds the trainers' send of a streamed publish."""
        sends = final and self.plan.publish_streams and self.plan.mode.disaggregated
        t = self.cost.time
        return self._memo(("c", sends), "Commit", lambda: t(Op.ALLREDUCE.value, 1, TRAINER)
                          + t(Op.OPTIMIZER.value, 1, TRAINER) + (t(Op.PUBLISH.value, 1, TRAINER) if sends else 0.0))

    def publish(self) -> float:
        pool = GENERATOR if self.plan.publish_streams else TRAINER
        return self._memo(("p",), "Publish", lambda: self.cost.time(Op.PUBLISH.value, 1, pool)
                          if self.plan.mode.disaggregated else 0.0)

    def of(self, action: Action) -> float:
        if isinstance(action, Train):
            return self.train(len(action.chunk.cells))
        if isinstance(action, Generate):
            return self.generate(action.size().generations, action.worker in self._trainers, action.switch)
        if isinstance(action, Commit):
            return self.commit(action.final)
        if isinstance(action, Publish):
            return self.publish()
        raise TypeError(f"not an action: {action!r}")


def _check(d: float, what: str) -> float:
    if not (d >= 0.0) or d == float("inf"):
        raise ValueError(f"cost model gave an invalid duration for {what}: {d!r}")
    return float(d)
