"""Online cost refinement: BTS plans with the costs the run shows (docs/architecture.md, "BTS": the cost
model is profiled online).

A run starts from a profile measured before it (the calibration on its workers, or ``runtime.profile``). The
machine it then meets can be slower or faster per kind of work: a GPU's clock under sustained load, a reward
service's latency, contention on shared cores, a profile from another day. The scheduler knows when it
launched every action and when its completion came back, so it measures each action as the controller sees
it (dispatch latency included, as the calibration's round trip is) and keeps, per action kind

    kind(a) in {generate/generator, generate/trainer, train, commit, publish}

(``generate/trainer``: TAG and colocated generation on a trainer rank), two sums decayed once per step:

    O_k <- decay * O_k + sum of observed seconds of the step's kind-k actions
    P_k <- decay * P_k + sum of the profile's seconds for the same actions
    s_k  = O_k / P_k                                            (1 until kind k was seen)

A ratio of sums, not a mean of ratios: long actions weigh more, as they do in a step time. The refined model is
``ScaledCost``: time'(op, n, pool) = time(op, n, pool) * s_kind(op, pool), the profile's shape over sizes at the
run's level (``control.observed.rescaled_profile`` does the same offline). It takes effect at each step's final
commit, so all decisions of one step use one model. An observation is kept within [1/clip, clip] x the
profile's seconds: an action queued behind a checkpoint or an eval on its worker says little of the op's cost,
and every factor stays positive. A factor
within 1e-9 of 1 is 1 (the rounding of ``(t0 + d) - t0`` in virtual time), so with exact costs the simulator's
decisions are those of the static model, bit for bit.
"""

from __future__ import annotations

from .actions import Action
from .cost import GENERATOR, TRAINER, CostModel, Durations, Op
from .plan import StepPlan

KINDS = ("generate/generator", "generate/trainer", "train", "commit", "publish")

_OP_KIND = {Op.TRAIN_CHUNK.value: "train", Op.ALLREDUCE.value: "commit", Op.OPTIMIZER.value: "commit",
            Op.PUBLISH.value: "publish", Op.TAG_SWITCH.value: "generate/trainer"}


def op_kind(op: str, pool: str) -> str:
    """The action kind whose factor scales ``op`` on ``pool`` (generation ops: per pool)."""
    return _OP_KIND.get(op) or f"generate/{TRAINER if pool == TRAINER else GENERATOR}"


class ScaledCost:
    """``base`` with one factor per action kind (``KINDS``; a missing kind: 1)."""

    def __init__(self, base: CostModel, scales: dict[str, float]):
        unknown = sorted(set(scales) - set(KINDS))
        if unknown:
            raise ValueError(f"scales: unknown action kind(s) {unknown} (one of {', '.join(KINDS)})")
        bad = {k: v for k, v in scales.items() if not v > 0 or v == float("inf")}
        if bad:
            raise ValueError(f"scales: factors must be positive and finite (got {bad})")
        self.base, self.scales = base, dict(scales)

    def time(self, op: str, batch: int, pool: str) -> float:
        return self.base.time(op, batch, pool) * self.scales.get(op_kind(op, pool), 1.0)


class OnlineCosts:
    """The decayed observed / profiled sums per action kind of one run (see the module docstring)."""

    def __init__(self, plan: StepPlan, base: CostModel, decay: float = 0.5, clip: float = 4.0):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay: must be in [0, 1) (got {decay})")
        if not clip >= 1.0:
            raise ValueError(f"clip: must be >= 1 (got {clip})")
        self.plan, self.base, self.decay, self.clip = plan, base, decay, clip
        self._profile = Durations(plan, base)  # the profile's prices, never rescaled
        self._trainers = frozenset(plan.trainers)  # ``plan.is_trainer``
        self._obs = dict.fromkeys(KINDS, 0.0)
        self._pred = dict.fromkeys(KINDS, 0.0)
        self._step_obs = dict.fromkeys(KINDS, 0.0)
        self._step_pred = dict.fromkeys(KINDS, 0.0)
        self.scales: dict[str, float] = {}     # the factors in effect (kinds seen so far)

    def kind(self, action: Action) -> str:
        """``action.kind``; a generation's per pool (``KINDS``)."""
        if action.kind != "generate":
            return action.kind
        return f"generate/{TRAINER if action.worker in self._trainers else GENERATOR}"

    def observe(self, action: Action, seconds: float) -> None:
        """``action`` took ``seconds`` from its launch to its completion event."""
        pred = self._profile.of(action)
        if not pred > 1e-12:  # a free op (publish when colocated, a zero-cost profile entry) has no level
            return
        k = self.kind(action)
        self._step_obs[k] += min(max(seconds, pred / self.clip), self.clip * pred)
        self._step_pred[k] += pred

    def end_step(self) -> CostModel | None:
        """Fold the step's observations into the sums; the refined model if a price changed, else None."""
        for k in KINDS:
            self._obs[k] = self.decay * self._obs[k] + self._step_obs[k]
            self._pred[k] = self.decay * self._pred[k] + self._step_pred[k]
            self._step_obs[k] = self._step_pred[k] = 0.0
        scales = {}
        for k in KINDS:
            if self._pred[k] > 0.0:
                s = min(max(self._obs[k] / self._pred[k], 1.0 / self.clip), self.clip)
                scales[k] = 1.0 if abs(s - 1.0) <= 1e-9 else s
        old, self.scales = self.scales, scales
        if all(abs(scales.get(k, 1.0) - old.get(k, 1.0)) <= 1e-9 * scales.get(k, 1.0) for k in KINDS):
            return None  # the same prices (the decay alone changes a ratio's last bits; unseen kinds are 1)
        return ScaledCost(self.base, scales)


__all__ = ["KINDS", "OnlineCosts", "ScaledCost", "op_kind"]
