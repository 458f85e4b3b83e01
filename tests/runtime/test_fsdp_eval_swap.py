"""A sharded trainer pool (FSDP2) that evaluates with the EMA weights between steps trains on to the
reference's weights (``tests/reference``): the swap in and out of the EMA reshards the modules (``train.ema.reshard``), so
the first training forward after an eval does not run on the root's gathered copy of the EMA weights (it did:
the step after each eval trained off-policy, its loss 1e-5 instead of ~1e-9)."""

from __future__ import annotations

from runtime_helpers import make_cfg, reference_run
from test_sharded_pool import _errors

RTOL = 1e-5


def test_fsdp_pool_with_mid_run_ema_evals_matches_the_reference(ray_local, tiny_model, tmp_path):
    from safetensors.torch import load_file

    from digenrl.runtime.driver import run_training

    over = ["runtime.mode=gap_tsp", "runtime.trainers=2", "train.sharding=fsdp", "train.ema_decay=0.5",
            "eval.every=1", "train.lr=3e-3"]
    ref, _ = reference_run(tiny_model, tmp_path / "ref", over, eval_weights=True)
    summary = run_training(make_cfg(tiny_model, tmp_path / "run", *over), ray=True)
    assert summary["audit_violations"] == [] and summary["version"] == 3
    per, glob = _errors(load_file(str(tmp_path / "run" / "checkpoint.safetensors")), ref)
    print(f"max relative error per tensor {per:.2e}, global {glob:.2e}")
    assert per <= RTOL and glob <= RTOL, (per, glob)
    assert _errors(load_file(str(tiny_model)), ref)[0] > 100 * RTOL  # the run really moved the weights
