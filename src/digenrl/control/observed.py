"""A cost profile from the spans a run recorded: what its ops really cost, runtime overheads included (Ray's own
threads, the controller and the other workers competing for the cores, the controller's turn-around between a
worker's actions), which a synthetic calibration's tight loop misses; the profile to plan the next run on the
same machines with (``digenrl plan --profile run_dir/profile_observed.json``).

From the spans that end by ``until`` (seconds of the run's clock; None: all), by their kind and ``size``
(``schedule.actions.Size``: generations of a fragment, cells of a chunk):

* ``<pool>/denoise`` at n generations = mean span of a ``generate`` / ``tag`` action of n / T (the whole
  fragment is charged on ``denoise``; ``vae_decode`` and ``transfer`` are 0);
* ``train_chunk`` at c cells = mean span of a ``train`` action of c cells; ``optimizer`` = mean ``commit`` span
  (``allreduce`` 0: the commit span includes it); ``publish`` = mean ``publish`` span of the trainers; a
  streamed publish (``streamed``, or spans on the generators alone, as older runs wrote them):
  ``generator/publish`` = mean generator span (the receive), ``trainer/publish`` = mean trainer span (the
  senders starting their sends; 0 where the trace has none);
* dispatch gap = mean idle gap shorter than ``max_gap_s`` between two actions of a worker; it is added to the op
  that ends each action (``reward`` for a fragment, ``train_chunk``, ``optimizer``, ``publish``), as the
  calibration adds its round trip.

Means, not medians: a step time is a sum of op times. A pool that did not generate gets the other pool's denoise
costs. Such a profile holds only the sizes the run used; ``rescaled_profile`` lays it over a calibration's curves
(their shape over every size, the run's level), which is what a run writes when it has a calibration."""

from __future__ import annotations

import statistics
from typing import Sequence

from digenrl.observe.trace import Span
from digenrl.schedule.cost import fragment_seconds

from .profile import ProfileCost, profile_dict


def observed_profile(spans: Sequence[Span], sampling_steps: int, until: float | None = None,
                     max_gap_s: float = 0.05, source: str = "spans of a run",
                     pools: tuple[int, int] | None = None, streamed: bool = False) -> dict:
    """The ``digenrl-profile`` dict of the ops the spans show (see the module docstring). ``streamed``: the run
    published with ``runtime.publish=stream``."""
    costs: dict[tuple[str, int], list[float]] = {}
    gaps: list[float] = []
    for s in spans:
        if until is not None and s.end > until:
            continue
        pool = s.pool if s.pool in ("generator", "trainer") else ("generator" if s.worker.startswith("gen")
                                                                  else "trainer")
        if s.kind in ("generate", "tag"):
            costs.setdefault((f"{pool}/denoise", s.size.generations), []).append(s.duration / sampling_steps)
        elif s.kind == "train":
            costs.setdefault(("train_chunk", s.size.cells), []).append(s.duration)
        elif s.kind == "commit":
            costs.setdefault((s.kind, 1), []).append(s.duration)
        elif s.kind == "publish":
            costs.setdefault(("publish" if pool == "trainer" else "generator/publish", 1), []).append(s.duration)
        elif s.kind == "idle" and s.duration < max_gap_s:
            gaps.append(s.duration)
    ops: dict[str, list] = {}
    for (op, n), ds in sorted(costs.items()):
        ops.setdefault(op, []).append([n, statistics.fmean(ds)])
    missing = [op for op in ("train_chunk", "commit") if op not in ops]
    if missing or not any(k.endswith("/denoise") for k in ops):
        raise ValueError(f"observed_profile: the spans{'' if until is None else f' up to {until:.1f} s'} have no "
                         f"{', '.join(missing) or 'generate'} action to price")
    gap = statistics.fmean(gaps) if gaps else 0.0
    for pool, other in (("generator", "trainer"), ("trainer", "generator")):
        ops.setdefault(f"{pool}/denoise", ops.get(f"{other}/denoise"))
        ops[f"{pool}/reward"] = [[1, gap], [2, gap]]  # two equal points: a constant (one point would scale with n)
    ops["train_chunk"] = [[n, v + gap] for n, v in ops["train_chunk"]]
    ops["optimizer"] = [[1, ops.pop("commit")[0][1] + gap]]
    if "generator/publish" in ops and (streamed or "publish" not in ops):  # streamed: receive and sends apart
        ops["generator/publish"] = [[1, ops["generator/publish"][0][1] + gap]]
        ops["trainer/publish"] = [[1, ops.pop("publish")[0][1] if "publish" in ops else 0.0]]
    else:
        ops.pop("generator/publish", None)
        ops["publish"] = [[1, ops["publish"][0][1] + gap]] if "publish" in ops else [[1, 0.0]]
    ops.update({"vae_decode": [[1, 0.0]], "transfer": [[1, 0.0]], "allreduce": [[1, 0.0]], "tag_switch": [[1, 0.0]]})
    return profile_dict(ops, source, pools)  # pools: the sizes the costs hold for (``digenrl plan`` checks them)


GENERATION_OPS = ("denoise", "vae_decode", "reward", "transfer")


def rescaled_profile(calibration, observed: dict, sampling_steps: int) -> dict:
    """The calibration's curves at the level the run showed: each action kind's calibrated curves are
    multiplied by r = mean over the sizes the run used of (observed action cost / calibrated action cost).

    A run shows one or two sizes per action kind, and a one-point curve scales in proportion to the size (no
    fixed cost), which misprices other sizes; the calibration measured every size but not the run's level.
    Action costs (``schedule.cost.Durations``): a fragment of n on pool p, T denoise(n) + vae_decode(n) +
    reward(n) + transfer(n); a chunk, train_chunk(c); a commit, allreduce + optimizer; a publish. An action
    kind the run did not show (a publish in a colocated run) keeps its calibrated curves (r = 1).
    ``calibration``: a ``control.profile.ProfileCost``."""
    obs = ProfileCost.from_dict(observed, where="observed profile")
    ops = observed["ops"]

    def points(op: str, pool: str) -> list:
        c = calibration.curves.get(f"{pool}/{op}") or calibration.curves[op]
        return [[b, s] for b, s in zip(c.batches, c.seconds)]

    def ratio(sizes, seconds) -> float:
        """Mean over ``sizes`` of seconds(observed, n) / seconds(calibration, n)."""
        rs = [seconds(obs, n) / seconds(calibration, n) for n in sizes
              if seconds(calibration, n) > 0 and seconds(obs, n) > 0]
        return statistics.fmean(rs) if rs else 1.0

    def scaled(op: str, pool: str, r: float) -> list:
        return [[b, s * r] for b, s in points(op, pool)]

    out: dict[str, list] = {}
    for pool in ("generator", "trainer"):
        sizes = [n for n, _ in ops[f"{pool}/denoise"]]
        r = ratio(sizes, lambda c, n, p=pool: fragment_seconds(c, sampling_steps, n, p))
        out.update({f"{pool}/{op}": scaled(op, pool, r) for op in GENERATION_OPS})
    r = ratio([n for n, _ in ops["train_chunk"]], lambda c, n: c.time("train_chunk", n, "trainer"))
    out["train_chunk"] = scaled("train_chunk", "trainer", r)
    r = ratio([1], lambda c, n: c.time("allreduce", 1, "trainer") + c.time("optimizer", 1, "trainer"))
    out.update({op: scaled(op, "trainer", r) for op in ("allreduce", "optimizer")})
    streamed = "generator/publish" in ops  # a streamed publish: the generators' receive at the run's level (the
    pool = "generator" if streamed else "trainer"  # trainers' sends are in their commit)
    r = ratio([1], lambda c, n: c.time("publish", 1, pool))
    out["generator/publish" if streamed else "publish"] = scaled("publish", pool, r)
    if streamed:
        out["trainer/publish"] = ops["trainer/publish"]
    out["tag_switch"] = points("tag_switch", "trainer")
    res = {k: v for k, v in observed.items() if k != "ops"}
    res["source"] = f"{observed.get('source', 'a run')}: the calibration's curves at the run's level"
    return {**res, "ops": out}
