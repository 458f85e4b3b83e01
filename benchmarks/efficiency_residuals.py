"""Per-measurement residuals of the fitted GPU efficiencies (``digenrl.sim.efficiency``).

Prices every cited public step-time measurement with the fitted plateau of its GPU kind and with the
leave-kind-out regression, and writes ``benchmarks/results/efficiency_residuals.json``:
{"plateaus": [...], "regression": {...}, "residuals": [{model, gpu, shape, steps, measured_s, mfu,
predicted_s, residual, loo_predicted_s, loo_residual, source}, ...]}.
Run: ``python benchmarks/efficiency_residuals.py [--out PATH]`` (seconds, CPU only).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from digenrl.sim.efficiency import MEASUREMENTS, fitted, plateau, residuals
from digenrl.sim.presets import H20, H100, L40S


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "efficiency_residuals.json"))
    args = ap.parse_args(argv)
    _, (a, b) = fitted()
    kinds = {m.gpu.name: m.gpu for m in MEASUREMENTS}
    kinds.update({g.name: g for g in (L40S, H100, H20)})
    res = {"plateaus": [{"gpu": k, "plateau": plateau(g)[0], "how": plateau(g)[1]} for k, g in kinds.items()],
           "regression": {"a": a, "b": b}, "residuals": residuals()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    for r in res["residuals"]:
        print(f"{r['model']:8s} {r['gpu']:15s} {r['shape']:14s} measured {r['measured_s']:8.2f} s  model "
              f"{r['predicted_s']:8.2f} s ({r['residual']:+.1%})  leave-kind-out {r['loo_residual']:+.1%}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
