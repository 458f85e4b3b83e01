"""Measured cost profiles: JSON points per operation, interpolated piecewise-linearly.

Schema (``profile_dict`` builds it and ``save_profile`` writes it, for every writer: ``digenrl profile``, a run's
calibration and observed profile; ``load_profile`` reads it, e.g. ``digenrl simulate --profile``)::

    {
      "format": "digenrl-profile",          # required
      "version": 1,                         # required
      "source": "free text (machine, model, date)",   # optional
      "generators": 8, "trainers": 8,       # optional: pool sizes the profile was measured with
      "ops": {                              # required: op -> list of [batch, seconds] points
        "denoise":          [[1, 0.42], [2, 0.80], [4, 1.55]],
        "trainer/denoise":  [[1, 0.40]],    # optional pool-specific override: "<pool>/<op>"
        "vae_decode": [[1, 0.9]], "reward": [[1, 0.05]], "transfer": [[1, 0.002]],
        "train_chunk": [[1, 1.3], [8, 9.1]], "allreduce": [[1, 2.0]], "optimizer": [[1, 0.05]],
        "publish": [[1, 1.1]], "tag_switch": [[1, 0.9]]
      }
    }

Ops are those of ``digenrl.schedule.cost`` (batch = generations, cells, or 1). Every op must be present
(generic or for both pools). Lookup: ``"<pool>/<op>"`` if present, else ``"<op>"``. Evaluation at batch b:
one point (b0, s0) -> s0 * b / b0 (proportional); several points -> linear interpolation between the two
neighbouring points, linear extrapolation from the two first / last points outside, clamped at 0.

**A profile at another trainer count** (``profile_at``, the one policy of ``digenrl simulate``, ``digenrl plan`` and
``digenrl train``'s prediction): every op is a worker's own work, the same at any pool size, except the gradient
all-reduce, which was measured at the profile's ``trainers`` = M ranks. At N ranks it is scaled as a ring
all-reduce scales, per-rank traffic 2 (N - 1) / N of the gradient::

    allreduce(N) = allreduce(M) x ((N - 1) / N) / ((M - 1) / M)          (0 at N = 1: no collective)

A profile without ``trainers`` is taken as measured at the trainer count of the config it prices (``digenrl
simulate --config``, ``digenrl plan``); one measured at one rank (no all-reduce), or without ``trainers`` where
there is no config (``simulate --model``), prices only its own count and N = 1: another is refused, naming why.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from pathlib import Path

from digenrl.safe_files import atomic_write_bytes

from ..schedule.cost import OPS, POOLS, CostModel

FORMAT = "digenrl-profile"
VERSION = 1


class ProfileError(ValueError):
    """A malformed profile; the message names the file / key and what is wrong."""


@dataclass(frozen=True)
class Curve:
    batches: tuple[float, ...]
    seconds: tuple[float, ...]

    def __call__(self, b: float) -> float:
        xs, ys = self.batches, self.seconds
        if len(xs) == 1:
            return max(0.0, ys[0] * b / xs[0])
        i = bisect.bisect_left(xs, b)
        i = min(max(i, 1), len(xs) - 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return max(0.0, y0 + (y1 - y0) * (b - x0) / (x1 - x0))


class ProfileCost:
    """A ``CostModel`` backed by measured points."""

    def __init__(self, curves: dict[str, Curve], source: str = ""):
        self.curves = curves
        self.source = source
        missing = [f"{op}" for op in OPS
                   if op not in curves and not all(f"{p}/{op}" in curves for p in POOLS)]
        if missing:
            raise ProfileError(f"ops: missing {', '.join(missing)} (need each op, or '<pool>/<op>' for both "
                               f"pools {', '.join(POOLS)})")

    def time(self, op: str, batch: int, pool: str) -> float:
        c = self.curves.get(f"{pool}/{op}") or self.curves.get(op)
        if c is None:
            raise KeyError(f"profile has no curve for op {op!r} on pool {pool!r}")
        return c(batch)

    @classmethod
    def from_dict(cls, data: dict, where: str = "profile") -> "ProfileCost":
        if not isinstance(data, dict):
            raise ProfileError(f"{where}: top level must be an object")
        if data.get("format") != FORMAT:
            raise ProfileError(f"{where}: 'format' must be {FORMAT!r} (got {data.get('format')!r})")
        if data.get("version") != VERSION:
            raise ProfileError(f"{where}: unsupported 'version' {data.get('version')!r} (expected {VERSION})")
        ops = data.get("ops")
        if not isinstance(ops, dict) or not ops:
            raise ProfileError(f"{where}: 'ops' must be a non-empty object of op -> [[batch, seconds], ...]")
        curves = {}
        for key, pts in ops.items():
            base = key.split("/", 1)[-1]
            if base not in OPS or ("/" in key and key.split("/", 1)[0] not in POOLS):
                raise ProfileError(f"{where}: ops.{key}: unknown op (ops: {', '.join(OPS)}; "
                                   f"pool prefixes: {', '.join(POOLS)})")
            curves[key] = _curve(pts, f"{where}: ops.{key}")
        return cls(curves, str(data.get("source", "")))

    def to_dict(self) -> dict:
        return profile_dict({k: [[b, s] for b, s in zip(c.batches, c.seconds)] for k, c in self.curves.items()},
                            self.source)


def _curve(pts, where: str) -> Curve:
    if not isinstance(pts, list) or not pts:
        raise ProfileError(f"{where}: must be a non-empty list of [batch, seconds]")
    rows = []
    for p in pts:
        if (not isinstance(p, (list, tuple)) or len(p) != 2
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in p)):
            raise ProfileError(f"{where}: bad point {p!r} (expected [batch, seconds])")
        b, s = float(p[0]), float(p[1])
        if not b > 0 or not s >= 0:
            raise ProfileError(f"{where}: point {p!r} needs batch > 0 and seconds >= 0")
        rows.append((b, s))
    rows.sort()
    if len({b for b, _ in rows}) != len(rows):
        raise ProfileError(f"{where}: duplicate batch sizes")
    return Curve(tuple(b for b, _ in rows), tuple(s for _, s in rows))


def load_profile(path: str | Path) -> ProfileCost:
    p = Path(path)
    if not p.is_file():
        raise ProfileError(f"--profile: file {str(p)!r} does not exist")
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ProfileError(f"--profile: {str(p)!r} is not valid JSON ({e})") from None
    return ProfileCost.from_dict(data, where=str(p))


class RingAllreduce:
    """``cost`` with the all-reduce moved from the ``measured`` trainer ranks it was timed on to ``ranks``."""

    def __init__(self, cost: CostModel, measured: int, ranks: int):
        self.cost = cost
        self.factor = 0.0 if ranks == 1 else ((ranks - 1) / ranks) / ((measured - 1) / measured)

    def time(self, op: str, batch: int, pool: str) -> float:
        t = self.cost.time(op, batch, pool)
        return t * self.factor if op == "allreduce" else t


def profile_at(cost: CostModel, measured: int | None, ranks: int) -> CostModel | str:
    """The profile ``cost`` (measured at ``measured`` trainer ranks; None: unknown) at ``ranks`` trainer ranks, or
    why it cannot price them (the module docstring's policy)."""
    if ranks == measured:
        return cost
    if ranks == 1:
        return RingAllreduce(cost, 2, 1)
    if measured is None or measured < 2:
        have = "has no 'trainers' key" if measured is None else "was measured at 1 trainer rank (no all-reduce)"
        return f"the profile {have}: its all-reduce at {ranks} trainer ranks is unknown"
    return RingAllreduce(cost, measured, ranks)


def profile_pools(path: str | Path) -> tuple[int | None, int | None]:
    """(generators, trainers) a profile JSON says it was measured with (None where it does not say)."""
    data = json.loads(Path(path).read_text())
    out = []
    for k in ("generators", "trainers"):
        v = data.get(k)
        out.append(int(v) if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else None)
    return out[0], out[1]


def profile_dict(ops: dict, source: str = "", pools: tuple[int, int] | None = None) -> dict:
    """The schema's dict (the one place its header is written): ``ops`` (op -> [[batch, seconds], ...]), the
    free-text ``source`` and, if known, the (generators, trainers) the costs were measured with."""
    out = {"format": FORMAT, "version": VERSION, "source": source}
    if pools is not None:
        out["generators"], out["trainers"] = int(pools[0]), int(pools[1])
    out["ops"] = ops
    return out


def save_profile(profile: ProfileCost | dict, path: str | Path) -> Path:
    """Write a profile (a ``ProfileCost`` or the schema's dict) to ``path``, atomically: every profile writer
    goes through here (``digenrl profile``, a run's calibration and its observed profile, tests). A dict is
    checked first (``ProfileError`` naming what is wrong): no writer can leave a file ``load_profile`` refuses."""
    data = profile.to_dict() if isinstance(profile, ProfileCost) else profile
    ProfileCost.from_dict(data, where=f"profile for {str(path)!r}")
    return atomic_write_bytes(path, json.dumps(data, indent=1).encode())
