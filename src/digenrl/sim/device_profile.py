"""The bare-device check's results (``benchmarks/gpu_device.py``, ``device.json``) as a cost profile the simulator
reads (``control.profile``: ``digenrl simulate --config ... --profile profile_device.json``).

A model family's profile is built from its measurements at 1 and 2 block units, scaled to the real block count
``L*`` (FLUX.1-dev 19 units of 1 double + 2 single blocks, Qwen-Image 60 blocks, Wan2.1-14B 40 blocks) per batch
by the affine rule of ``benchmarks/gpu_calibrate.py``: identical blocks add the same time each, the rest (embedders,
output projection, launches) is the intercept::

    t(L) = a + b L      through the points at L = 1, 2     ->    t(L*) = t(1) + (t(2) - t(1)) (L* - 1)

* ``denoise`` (both pools): one forward per denoising step at each batch (the ``forward`` stage; CFG models
  price their second forward by a batch twice as large: the profile's batch is the generations);
* ``train_chunk``: forward + backward with recomputation at each chunk size (the ``train`` stage);
* ``vae_decode``: the FLUX VAE's decode (the ``vae`` stage; not scaled);
* ``publish``: the trainable state (2 bytes per parameter of the family, ``models.specs``) copied device -> host
  and host -> device over pinned memory at the ``host_copy`` stage's rates;
* ``reward``, ``transfer``, ``allreduce``, ``optimizer``, ``tag_switch``: not measured by this check, written as
  0 and named in the profile's ``source``.
"""

from __future__ import annotations

from ..control.profile import profile_dict
from ..models.specs import canonical, spec
from .efficiency import line_fit

TARGET_UNITS = {"flux": 19, "qwen_image": 60, "wan": 40}


def affine_at(points: dict[int, float], target: int) -> float:
    """t(target) from the points {units: seconds} by least squares of t = a + b L (exact for two). More blocks
    never take less time, so beyond the measured counts t(target) >= the slowest point (a slope below 0 is timing
    noise, as with tiny widths on a busy CPU; the profile then never prices a measured op at 0 s)."""
    if len(points) < 2:
        raise ValueError(f"device results: need two block counts to scale (got {sorted(points)})")
    a, b = line_fit(list(points), list(points.values()))
    floor = max(points.values()) if target >= max(points) else 0.0
    return max(floor, a + b * target)


def _scaled(per_units: dict[str, list], target: int) -> list[list[float]]:
    """{units: [[batch, seconds or None, ...], ...]} -> [[batch, t(target)]] over the batches measured at every
    unit count."""
    table: dict[int, dict[int, float]] = {}
    for u, pts in per_units.items():
        for p in pts:
            if p[1] is not None:
                table.setdefault(int(p[0]), {})[int(u)] = float(p[1])
    units = {int(u) for u in per_units}
    return [[b, affine_at(t, target)] for b, t in sorted(table.items()) if set(t) == units]


def _stage(raw: dict, name: str) -> dict:
    st = raw.get("stages", {}).get(name)
    if not st or not st.get("ok"):
        raise KeyError(f"device results: stage {name!r} did not complete")
    return st["result"]


def profile_from_device(raw: dict, family: str = "flux") -> dict:
    """The ``digenrl-profile`` dict of ``family`` (module docstring)."""
    if raw.get("format") != "digenrl-device-results":
        raise ValueError("device results: 'format' must be 'digenrl-device-results'")
    if canonical(family) not in TARGET_UNITS:  # (the device results key a family as the benchmark names it)
        raise KeyError(f"device results: unknown family {family!r} (choose from {', '.join(TARGET_UNITS)})")
    target = TARGET_UNITS[canonical(family)]
    fwd = _scaled(_stage(raw, "forward")[family], target)
    train = _scaled(_stage(raw, "train")[family], target)
    if not fwd or not train:
        raise ValueError(f"device results: {family} has no batch measured at every block count")
    vae = _stage(raw, "vae")["points"]
    copy = _stage(raw, "host_copy")["pinned"]
    nbytes = 2.0 * spec(family).arch.params
    publish = nbytes / (copy["d2h_gbs"] * 1e9) + nbytes / (copy["h2d_gbs"] * 1e9)
    m = raw["meta"]
    ops = {"denoise": fwd, "vae_decode": vae, "train_chunk": train, "publish": [[1, publish]],
           "reward": [[1, 0.0]], "transfer": [[1, 0.0]], "allreduce": [[1, 0.0]], "optimizer": [[1, 0.0]],
           "tag_switch": [[1, 0.0]]}
    source = (f"benchmarks/gpu_device.py on {m['device']} ({m['date']}, torch {m['torch']}, {m['dtype']}"
              f"{', tiny widths' if m.get('tiny') else ''}): {family} denoise and train_chunk (recomputation) "
              f"measured at {'/'.join(str(u) for u in m['units'])} block units and scaled to {target} by "
              f"t = a + b L; vae_decode the FLUX VAE; publish = 2 bytes x {spec(family).arch.params:.3g} "
              f"parameters over pinned host copies; reward, transfer, allreduce, optimizer, tag_switch not "
              f"measured (0); one device")
    return profile_dict(ops, source, (1, 1))


__all__ = ["TARGET_UNITS", "affine_at", "profile_from_device"]
