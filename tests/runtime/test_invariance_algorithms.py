"""I1 for train.algorithm=grpo_guard, mixgrpo (and MixGRPO-Flash) and nft: the Ray runtime ends with the
reference's parameters (``tests/reference``) in every on-policy mode (colocated, naive, gap, gap_tsp, gap_tsp_tag: each
algorithm in each, one case per pair; the cases are tiny: the plain algorithm's I1 is test_invariance), and
each algorithm runs in ``full`` (TCSS, off-policy: no I1) with a clean audit and its staleness bound."""

from __future__ import annotations

import pytest

from runtime_helpers import make_cfg

RTOL = 1e-5
RTOL_MINIBATCHES = 5e-5  # as test_invariance: off-policy minibatches amplify float noise of the fragments

GUARD = ["train.algorithm=grpo_guard"]
# 6 sampling steps: MixGRPO's window range is [0, 4); w = 2 moving every step: windows (0,1), (1,2), (2,3)
MIX = ["train.algorithm=mixgrpo", "sampler.num_steps=6", "train.window_size=2", "train.window_shift_interval=1"]
# MixGRPO-Flash: DPM-Solver++ 2M after the window on MixGRPO's compressed static-shift schedule (8 -> 4..6 steps)
FLASH = [*MIX, "sampler.num_steps=8", "sampler.static_shift=3", "sampler.post_solver=dpmpp_2m",
         "sampler.post_compress_ratio=0.5"]
MINIBATCHES = ["train.minibatches_per_step=2", "train.inner_epochs=2"]
# DiffusionNFT: ODE samples, K = int(0.99 x 4) = 3 training slots per sample, each with its own drawn t and noise
NFT = ["train.algorithm=nft"]
# its old policy (train.nft_old_policy=soft, the default): a fast schedule so that old_k is far from theta_k; the
# generators sample with old_k (the publish, TAG and the broadcast swap it in) and v_old is its forward
SOFT = [*NFT, "train.nft_old_decay=[0, 0.25, 0.5]"]
RTOL_FSDP = 1e-4  # the sharded pool's reduce-scatter sums in another order (test_invariance_step_wide: 1e-4)

CASES = {
    "colocated-grpo_guard": ["runtime.trainers=1", *GUARD],
    "gap_tsp_tag-grpo_guard-minibatches": [*GUARD, *MINIBATCHES],  # the ratio leaves 1: the recorded means count
    "colocated-mixgrpo": ["runtime.trainers=1", *MIX],
    "gap_tsp_tag-mixgrpo": MIX,
    # MixGRPO's minibatches (train.minibatch_split=generations): round m trains block m of every group's
    # generations, masked per group as soon as it is rewarded (pipelined), with the weights after commit m - 1
    "gap_tsp_tag-mixgrpo-minibatches_generations": [*MIX, "train.minibatches_per_step=2",
                                                    "train.minibatch_split=generations"],
    "colocated-mixgrpo_flash": ["runtime.trainers=1", *FLASH],
    "gap_tsp_tag-mixgrpo_flash": FLASH,
    "colocated-nft": ["runtime.trainers=1", *NFT],
    "gap_tsp_tag-nft-minibatches": [*NFT, *MINIBATCHES],  # old = each optimizer step's weights
    "gap_tsp_tag-nft-global_std": [*NFT, "train.std_mode=global"],  # deferred heads: A l + m (algo.nft)
    "gap_tsp-nft-batch_baseline": [*NFT, "train.adv_baseline=batch", "train.beta_kl=0.1"],
    # the barrier modes and gap_tsp of each algorithm (one case per pair; Flash shares MixGRPO's trainer path)
    "naive-grpo_guard": GUARD,
    "gap-grpo_guard": GUARD,
    "gap_tsp-grpo_guard": GUARD,
    "naive-mixgrpo": MIX,
    "gap-mixgrpo_flash": FLASH,
    "gap_tsp-mixgrpo": MIX,
    "naive-nft": NFT,
    "gap-nft": NFT,
    # the soft old policy with weight: replicated and sharded (FSDP, 2 ranks), broadcast publish, and current
    "colocated-nft-soft": ["runtime.trainers=1", *SOFT],
    "gap_tsp-nft-soft-fsdp": [*SOFT, "runtime.trainers=2", "train.sharding=fsdp"],
    "gap_tsp_tag-nft-soft-broadcast": [*SOFT, "runtime.publish=broadcast"],
    "gap_tsp-nft-current": [*NFT, "train.nft_old_policy=current"],
}


def _reference(tiny_model, run_dir, math):
    from reference import reference_run

    return reference_run(make_cfg(tiny_model, run_dir, *math))[0]


def _rel_err(got: dict, ref: dict) -> float:
    assert set(got) == set(ref)
    return max(float((got[k] - ref[k]).norm() / ref[k].norm().clamp_min(1e-12)) for k in ref)


@pytest.mark.parametrize("case", list(CASES))
def test_algorithm_mode_matches_reference(case, ray_local, tiny_model, tmp_path):
    from safetensors.torch import load_file

    from digenrl.runtime.driver import run_training

    mode = case.split("-")[0]
    math = [o for o in CASES[case] if not o.startswith("runtime.")]
    ref = _reference(tiny_model, tmp_path / "ref", math)
    cfg = make_cfg(tiny_model, tmp_path / "run", f"runtime.mode={mode}", *CASES[case])
    summary = run_training(cfg, ray=True)
    assert summary["audit_violations"] == []
    assert summary["version"] == cfg.steps
    got = load_file(str(tmp_path / "run" / "checkpoint.safetensors"))
    err = _rel_err(got, ref)
    rtol = RTOL_FSDP if "fsdp" in case else RTOL_MINIBATCHES if "minibatches" in case else RTOL
    assert err <= rtol, f"{case}: {err:.2e} from the reference"
    assert _rel_err(load_file(str(tiny_model)), ref) > 100 * RTOL  # the weights really moved
    # ... and the algorithm computes something else than plain Flow-GRPO with the same settings
    plain = _reference(tiny_model, tmp_path / "plain",
                       [o for o in math if not o.startswith(("train.algorithm", "train.nft_", "sampler.post_"))])
    assert _rel_err(plain, ref) > 100 * RTOL
    if "soft" in case:  # ... and the soft old policy something else than old = the live weights
        current = _reference(tiny_model, tmp_path / "current",
                             [o for o in math if not o.startswith("train.nft_old")] + ["train.nft_old_policy=current"])
        assert _rel_err(current, ref) > 100 * RTOL


@pytest.mark.parametrize("algorithm", ["grpo_guard", "mixgrpo", "nft"])
def test_algorithm_runs_in_full_mode(algorithm, ray_local, tiny_model, tmp_path):
    """full (TCSS): stale samples (version k - 1 in step k) train, the audit is clean, staleness <= 1 and
    within runtime.max_stale_fraction (no I1: the stale samples make it another computation)."""
    import json

    from digenrl.runtime.driver import run_training

    math = {"grpo_guard": GUARD, "mixgrpo": MIX, "nft": NFT}[algorithm]
    run = tmp_path / "run"
    cfg = make_cfg(tiny_model, run, "runtime.mode=full", "steps=4", "runtime.max_stale_fraction=0.5", *math)
    summary = run_training(cfg, ray=True)
    assert summary["audit_violations"] == [] and summary["version"] == cfg.steps
    trajs = [json.loads(x) for x in (run / "trajectories.jsonl").read_text().splitlines()]
    per_step = cfg.train.prompts_per_step * cfg.train.generations
    assert len(trajs) == cfg.steps * per_step
    assert all(t["version"] in (t["step"] - 1, t["step"] - 2) for t in trajs)  # (steps from 1, as metrics.jsonl)
    stale = [sum(t["version"] == t["step"] - 2 for t in trajs if t["step"] == k) for k in range(1, cfg.steps + 1)]
    assert stale[0] == 0 and sum(stale) > 0 and max(stale) <= int(0.5 * per_step), stale  # TCSS really ran
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if "reward_mean" in x]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(r["loss"] == r["loss"] for r in rows)  # no NaN
