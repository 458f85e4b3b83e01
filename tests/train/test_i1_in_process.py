"""I1 in this process: ``digenrl train``'s one path (scheduler, control loop, worker executor, the colocated worker
in-process) ends with the parameters of the reference written from the formulas (``tests/reference``), for the
math every mode shares: minibatches and inner epochs, the four algorithms (GRPO-Guard's bias per forward's block
and per cell, MixGRPO's aggregated advantage and minibatches of generations, DiffusionNFT's integer time at
sampling only), step-wide statistics with a KL, best-of-n, Flow-GRPO's refill and sample minibatches, the
recomputed logp_old with its truncated weight, the three SDE kinds and the EMA. The Ray modes are checked against the same reference in ``tests/runtime``.

The reference shares no training code with the product (``test_the_reference_imports_no_training_math``), so a
wrong loss or advantage in the product shows here (``scripts/mutants.py`` flips the ratio and the baseline)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from product import product_steps
from reference import reference_run

RTOL = 1e-5  # measured: 3.5e-7 .. 1.0e-6 per tensor after 3 steps (the two round differently, that is all)
SMALL = ["steps=3", "train.prompts_per_step=3", "train.generations=4", "sampler.num_steps=4",
         "train.chunk_generations=3", "train.chunk_timesteps=2", "eval.every=0", "log.progress=false",
         "train.ema_decay=null"]
MB = ["train.minibatches_per_step=2", "train.inner_epochs=2"]
CASES = {
    "flow_grpo": [],
    "minibatches-kl": [*MB, "train.beta_kl=0.05", "train.kl_form=exact"],
    "step_wide": ["train.std_mode=global", "train.adv_baseline=batch", "train.beta_kl=0.1"],
    "recompute-tis": ["train.old_logprob=recompute", "train.tis_cap=1.5", *MB],
    "grpo_guard": ["train.algorithm=grpo_guard", *MB],  # guard_bias=batch: the mean over a forward's block
    "grpo_guard-cell": ["train.algorithm=grpo_guard", "train.guard_bias=cell", *MB],
    "mixgrpo": ["train.algorithm=mixgrpo", "sampler.num_steps=6", "train.window_size=2",
                "train.window_shift_interval=1"],
    "nft-soft": ["train.algorithm=nft", "train.nft_old_decay=[0, 0.25, 0.5]", *MB],
    "nft-current-global": ["train.algorithm=nft", "train.nft_old_policy=current", "train.std_mode=global"],
    # 5 steps: a schedule off the 1/1000 grid, so integer time in training would be another computation
    "nft-integer_sampling": ["train.algorithm=nft", "sampler.integer_timesteps=sampling", "sampler.num_steps=5"],
    # MixGRPO as its authors run it: clamp(sum_k w_k A_k) in one clipped loss (the default reward_aggregation of
    # mixgrpo), off policy (a clip the ratios leave, a clamp that acts), and minibatches of generations
    "mixgrpo-aggregated-generations": ["train.algorithm=mixgrpo", "sampler.num_steps=6", "train.window_size=2",
                                       "train.window_shift_interval=1", "train.adv_per_reward=true",
                                       "reward={digits: {weight: 1.0}, jpeg_compressibility: {weight: 0.5}}",
                                       "train.adv_clip_max=1.0", "train.clip_range=1e-4",
                                       "train.minibatch_split=generations", *MB],
    "best_of_n-refill": ["train.best_of_n=2", "train.zero_adv_refill=true", "train.micro_batch=4",
                         "train.beta_kl=0.05"],
    "samples-epochs": ["train.minibatch_split=samples", *MB, "train.best_of_n=2", "train.filter_zero_advantage=false"],
    "dance-per_reward-ema": ["sampler.kind=dance", "sampler.noise_level=0.3", "train.ema_decay=0.9",
                             "train.ema_every=1", "train.ema_update=per_micro_batch", "train.micro_batch=6",
                             "reward={digits: {weight: 1.0}, jpeg_compressibility: {weight: 0.5}}",
                             "train.adv_per_reward=true"],
    "cps-clip": ["sampler.kind=cps", "train.clip_range=1e-4", *MB],
    # per-reward advantages with step-wide statistics: refused in the pipelined modes only (the config), it runs in
    # the barrier modes, where every reward is in before the first cell
    "per_reward-step_wide": ["reward={digits: {weight: 1.0}, jpeg_compressibility: {weight: 0.5}}",
                             "train.adv_per_reward=true", "train.std_mode=global", "train.adv_baseline=batch"],
}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


@pytest.mark.parametrize("case", list(CASES))
def test_the_one_path_matches_the_reference(case, tmp_path):
    from digenrl.config import load_config
    from digenrl.models.tiny_dit import TinyDiTConfig, TinyDiTPolicy

    torch.manual_seed(0)
    model = tmp_path / "tiny.safetensors"
    TinyDiTPolicy(TinyDiTConfig(dim=32, depth=1, heads=2)).save(model)
    cfg = load_config(None, [*SMALL, f"model.path={model}", *CASES[case]])
    ema = cfg.train.ema_decay is not None
    ref, ref_rows, _ = reference_run(cfg, eval_weights=ema)
    worker, rows = product_steps(cfg)
    ctx = worker.ctx
    with ctx.eval_weights():
        got = {k: v.detach().clone() for k, v in ctx.policy.state_dict().items()}
    errs = {k: _rel(got[k], ref[k]) for k in ref}
    worst = max(errs, key=errs.get)
    assert errs[worst] <= RTOL, f"{case}: {worst} differs by {errs[worst]:.2e} from the reference"
    from safetensors.torch import load_file

    init = load_file(str(model))  # the weights moved (the comparison is not vacuous)
    assert max(_rel(init[k], ref[k]) for k in ref) > 100 * RTOL
    for got_row, want in zip(rows, ref_rows):  # the step's statistics, as the reference counts them
        assert got_row["kept_fraction"] == want["kept_fraction"]
        for key in ("loss", "kl", "approx_kl"):
            assert got_row[key] == pytest.approx(want[key], rel=1e-3, abs=1e-7), (case, key)


def test_per_reward_step_wide_is_refused_where_a_group_trains_before_the_last_reward():
    from digenrl.config import ConfigError, load_config

    on = ["train.adv_per_reward=true", "train.std_mode=global"]
    assert load_config(None, [*on, "runtime.mode=naive"]).train.adv_per_reward
    with pytest.raises(ConfigError, match="train.adv_per_reward"):
        load_config(None, [*on, "runtime.mode=gap"])


def test_the_options_change_the_result(tmp_path):
    """The cases are not one computation in disguise: the reference itself moves with the math options."""
    from digenrl.config import load_config
    from digenrl.models.tiny_dit import TinyDiTConfig, TinyDiTPolicy

    torch.manual_seed(0)
    model = tmp_path / "tiny.safetensors"
    TinyDiTPolicy(TinyDiTConfig(dim=32, depth=1, heads=2)).save(model)
    out = {}
    for case in ("flow_grpo", "minibatches-kl", "grpo_guard", "nft-soft", "best_of_n-refill"):
        cfg = load_config(None, [*SMALL, "steps=1", f"model.path={model}", *CASES[case]])
        out[case] = reference_run(cfg)[0]
    names = list(out)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert max(_rel(out[a][k], out[b][k]) for k in out[a]) > 100 * RTOL, (a, b)


FORBIDDEN = ("digenrl.train", "digenrl.algo.advantage", "digenrl.algo.loss", "digenrl.algo.sde", "digenrl.algo.guard",
             "digenrl.algo.nft", "digenrl.algo.deferred_std")
SAMPLER = ("digenrl.algo.sde",)  # loaded by the sampler that records the trajectories (an input), not used here


def test_the_reference_imports_no_training_math():
    """``tests/reference`` imports none of the product's training math, at any depth: neither in its source (AST)
    nor when it runs (the modules loaded by a reference step)."""
    root = Path(__file__).resolve().parents[1] / "reference"
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            bad = [n for n in names if n.startswith(FORBIDDEN)]
            assert not bad, f"{path.name} imports {bad}"
    code = ("import sys, torch; sys.path.insert(0, sys.argv[1]); torch.set_num_threads(1)\n"
            "from digenrl.config import load_config\n"
            "from reference import reference_run\n"
            "cfg = load_config(None, ['steps=1', 'train.prompts_per_step=2', 'train.generations=4',"
            " 'sampler.num_steps=4', 'train.beta_kl=0.1', 'train.algorithm=grpo_guard'])\n"
            "reference_run(cfg)\n"
            f"bad = sorted(m for m in sys.modules if m.startswith({FORBIDDEN!r}) and m not in {SAMPLER!r})\n"
            "assert not bad, bad\n")
    out = subprocess.run([sys.executable, "-c", code, str(root.parent)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
