"""Mutation check: does the suite catch a fixed list of plausible bugs?

Each mutant changes one piece of logic (exact old text -> new text in one or more files) and names the test
files that should catch it. The script copies the working tree (the files git tracks or does not ignore) into
a temporary directory, checks that every mutant's old text occurs exactly once where it should, runs each
mutant's tests once unmutated (a baseline that must pass), then, one mutant at a time, writes the mutated
file(s), runs the tests with ``pytest -x -q`` (a timeout per mutant) and restores the file(s). A mutant is
``caught`` when its tests fail (or time out: a hang is a failure too).

    python scripts/mutants.py               # a table
    python scripts/mutants.py --json        # a JSON list: {name, caught, tests, rc, seconds, detail, ...}
    python scripts/mutants.py --only NAME   # some mutants (repeatable); --list prints the names

Exit 0 when it ran (whatever was caught); 2 when it could not run: a mutant's old text not found (or found
more than once), a file missing, or the copy not importing its own ``src/`` - each named in the message.
The copy is imported through ``PYTHONPATH=<copy>/src`` (ahead of the editable install's path entry); the
script checks that ``digenrl`` resolves there before running anything.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Site:
    """One text replacement: ``old`` must occur exactly once in ``file`` (unless ``optional``: then a site that
    is not there is skipped, e.g. while code moves between two places; at least one site of a mutant applies)."""

    file: str
    old: str
    new: str
    optional: bool = False


@dataclass(frozen=True)
class Mutant:
    name: str
    sites: tuple[Site, ...]
    tests: tuple[str, ...]          # pytest arguments: test files or node ids
    why: str = ""
    extra: tuple[str, ...] = field(default=())  # more pytest arguments (e.g. -k)


def _m(name, file, old, new, tests, why="", extra=()):
    return Mutant(name, (Site(file, old, new),), tuple(tests), why, tuple(extra))


AUDIT = "src/digenrl/schedule/audit.py"
NONDEF = "tests/train/test_nondefault_branches.py"
FORMS = "tests/train/test_reference_forms.py"
MUTANTS: tuple[Mutant, ...] = (
    _m("audit: cells trained too often pass (n != want -> n < want)", AUDIT,
       "                        if n != want:", "                        if n < want:",
       ["tests/schedule/test_audit_rejects.py"], "I2 oracle weakened"),
    _m("audit: no rewards-before-training check", AUDIT,
       "            if group_gens != list(range(plan.generations)) or group_done[(c.step, c.group)] > t + eps:",
       "            if False:",
       ["tests/schedule/test_audit_rejects.py"], "I3 oracle removed"),
    _m("audit: TAG version check removed", AUDIT,
       "                if a.version != f.step or commits_at(t) != f.step * R:", "                if False:",
       ["tests/schedule/test_audit_rejects.py"], "I3 oracle for TAG after a commit removed"),
    _m("audit: stale cap not checked", AUDIT,
       "        if stale[k] > plan.stale_cap:", "        if False:",
       ["tests/schedule/test_audit_rejects.py"], "I4 oracle removed"),
    _m("runtime: _check_cells disabled", "src/digenrl/runtime/executor.py",
       "        if len(st.cells) != len(set(st.cells)) or set(st.cells) != want:", "        if False:",
       ["tests/runtime/test_check_cells.py"], "the runtime's I2 check removed"),
    _m("I5: seed ignores the run seed", "src/digenrl/rollout/noise.py",
       "    return stable_seed(int(run_seed), int(step), int(uid), int(gen))",
       "    return stable_seed(0, int(step), int(uid), int(gen))",
       ["tests/rollout/test_noise_invariance.py"]),
    _m("I5: seed ignores the prompt uid", "src/digenrl/rollout/noise.py",
       "    return stable_seed(int(run_seed), int(step), int(uid), int(gen))",
       "    return stable_seed(int(run_seed), int(step), 0, int(gen))",
       ["tests/rollout/test_noise_invariance.py"]),
    _m("I5: seed ignores the generation index", "src/digenrl/rollout/noise.py",
       "    return stable_seed(int(run_seed), int(step), int(uid), int(gen))",
       "    return stable_seed(int(run_seed), int(step), int(uid), 0)",
       ["tests/rollout/test_noise_invariance.py"]),
    # the round's 1/kept (train.loss_scale): Adam barely sees a uniform gradient scale, so the parity tests against
    # an independently written Flow-GRPO step with a kept < B minibatch and a clipped gradient norm catch it
    _m("loss scale 1/B instead of 1/kept", "src/digenrl/train/loss_scale.py",
       "    return LossScale(num_trained, sum(kept_count(a, filter_zero, k) for a, k in zip(advantages, keep, "
       "strict=True)))",
       "    return LossScale(num_trained, sum(len(a) for a in advantages))",
       ["tests/train/test_recipe_parity.py"], "a kept < B case against an independent reference"),
    # the loss and the advantage in the product: I1 now checks the math (tests/reference shares none of it)
    _m("loss: the ratio inverted (r = exp(logp_old - logp))", "src/digenrl/algo/loss.py",
       "    log_ratio = log_prob - old_log_prob", "    log_ratio = old_log_prob - log_prob",
       ["tests/train/test_i1_in_process.py"], "I1 against the reference written from the formulas"),
    _m("advantage: the baseline's sign flipped", "src/digenrl/algo/advantage.py",
       "        adv[m] = (r - base) / (denom + eps)", "        adv[m] = (base - r) / (denom + eps)",
       ["tests/train/test_i1_in_process.py"], "I1 against the reference written from the formulas"),
    _m("minibatches in reversed order", "src/digenrl/schedule/plan.py",
       "    return group * minibatches // prompts", "    return (prompts - 1 - group) * minibatches // prompts",
       ["tests/train/test_minibatches.py"]),
    _m("scheduler: TAG after a minibatch commit", "src/digenrl/schedule/scheduler.py",
       "        if not pending or s >= self.plan.steps or self.published != s or self.round > 0:",
       "        if not pending or s >= self.plan.steps or self.published != s:",
       ["tests/schedule/test_tag_guard.py"], "BTS itself declines these TAGs: only a greedy policy shows the guard"),
    _m("EMA update count not restored on resume", "src/digenrl/train/checkpoint.py",
       "        ctx.ema.num_updates = state.ema_updates", "        ctx.ema.num_updates = 0",
       ["tests/train/test_ema_resume.py"]),
    _m("BTS TickModel: gang of the head group only", "src/digenrl/schedule/bts_model.py",
       "total - nxt if self.gang_groups else F - nxt % F)", "F - nxt % F)",
       ["tests/schedule/test_bts_model_agreement.py"]),
    _m("tiles_makespan: full tail term", "src/digenrl/schedule/layout.py",
       "    return sum(times) / n + (1.0 - 1.0 / n) * max(times, default=0.0)",
       "    return sum(times) / n + max(times, default=0.0)",
       ["tests/schedule/test_chunk_shape.py", "tests/schedule/test_sched_layout.py"]),
    # --- branches only a non-default value reaches (issue 40): each caught by a test whose expected value
    # changes with that value, from a formula written in the test
    _m("asymmetric clip: the lower bound takes the upper range", "src/digenrl/algo/loss.py",
       "torch.clamp(ratio, 1.0 - low, 1.0 + high)", "torch.clamp(ratio, 1.0 - high, 1.0 + high)",
       [NONDEF], "train.clip_range_low != train.clip_range_high"),
    _m("asymmetric clip: clipfrac_lt_one against the upper range", "src/digenrl/algo/loss.py",
       "clipfrac_lt_one=(1.0 - ratio > low)", "clipfrac_lt_one=(1.0 - ratio > high)", [NONDEF]),
    _m("global std ignores train.adv_std_unbiased", "src/digenrl/algo/advantage.py",
       "    gstd, gmean = float(rewards.std(unbiased=unbiased)), float(rewards.mean())",
       "    gstd, gmean = float(rewards.std(unbiased=False)), float(rewards.mean())",
       [NONDEF], "train.std_mode=global with train.adv_std_unbiased=true"),
    _m("trained position taken for the denoising step", "src/digenrl/train/chunk_loss.py",
       "    step_idx = group.trained_steps[tpos]", "    step_idx = tpos",
       [NONDEF], "trained timesteps that do not start at step 0 (window, uniform, mixgrpo)"),
    _m("EMA: warm-up applied with train.ema_warmup=false", "src/digenrl/train/ema.py",
       "        d = min((1 + n) / (10 + n), self.decay) if self.warmup else self.decay",
       "        d = min((1 + n) / (10 + n), self.decay)", [NONDEF]),
    _m("EMA: train.ema_every counted from 0", "src/digenrl/train/ema.py",
       "        if (n + 1) % self.every != 0:", "        if n % self.every != 0:", [NONDEF]),
    _m("resume: the torch RNG not restored", "src/digenrl/train/checkpoint.py",
       "    torch.set_rng_state(state.rng[\"torch_cpu\"])", "    pass", [NONDEF]),
    _m("resume: runtime.max_stale_fraction free in full mode", "src/digenrl/train/resume_config.py",
       "    if mode != \"full\":\n        out.pop(\"runtime.max_stale_fraction\", None)",
       "    out.pop(\"runtime.max_stale_fraction\", None)", [NONDEF]),
    _m("TCSS: the stale cap is exclusive", "src/digenrl/schedule/scheduler.py",
       "nxt.stale_generations + nxt.pending[0].size <= p.stale_cap:",
       "nxt.stale_generations + nxt.pending[0].size < p.stale_cap:", ["tests/schedule/test_stale_cap_boundary.py"],
       "a fragment that fills the cap"),
    _m("CFG: train.cfg_detach_uncond keeps the gradient", "src/digenrl/models/base.py",
       "        v_uncond = v_uncond.detach()", "        v_uncond = v_uncond", [NONDEF]),
    _m("generation minibatches: block by j mod M", "src/digenrl/train/sample_masks.py",
       "minibatch_of(j, generations, minibatches) == m", "j % minibatches == m", [FORMS],
       extra=("-k", "generation_minibatches")),
    _m("reward aggregation: the weighted sum not clamped", "src/digenrl/train/chunk_loss.py",
       "        return term((adv * w).sum(1).clamp(-settings.adv_clip_max, settings.adv_clip_max))",
       "        return term((adv * w).sum(1))", [FORMS], extra=("-k", "mixgrpo_aggregates")),
    _m("GRPO-Guard: the batch mean bias per cell", "src/digenrl/train/chunk_loss.py",
       "        units = tpos.to(out.mean.device) if settings.guard_bias == \"batch\" else None",
       "        units = None", [FORMS], extra=("-k", "grpo_guard")),
    _m("DiffusionNFT: integer time in training too", "src/digenrl/train/context.py",
       "        integer_timesteps=s.integer_timesteps is True,", "        integer_timesteps=bool(s.integer_timesteps),",
       [FORMS], extra=("-k", "nft")),
    _m("order-free sums kept in float32", "src/digenrl/train/transaction.py",
       "                g = p.grad.to(torch.float64)", "                g = p.grad.clone()",
       ["tests/runtime/test_grad_sum.py"], extra=("-k", "order")),
)


class SetupError(RuntimeError):
    """The script cannot run (exit 2); the message names the mutant or the file."""


def working_tree_files(root: Path) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, check=True,
                         capture_output=True).stdout.decode()
    return [p for p in out.split("\0") if p and (root / p).is_file()]


def copy_tree(root: Path, dest: Path) -> None:
    for rel in working_tree_files(root):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)


def plan_sites(tree: Path, mutants) -> dict[str, list[Site]]:
    """mutant name -> the sites that apply; SetupError naming every mutant whose text is not where it should be."""
    problems, plan = [], {}
    for m in mutants:
        applied = []
        for s in m.sites:
            path = tree / s.file
            n = path.read_text().count(s.old) if path.is_file() else 0
            if n == 1:
                applied.append(s)
            elif n > 1:
                problems.append(f"mutant {m.name!r}: old text occurs {n} times in {s.file} (must be once): {s.old!r}")
            elif not s.optional:
                what = "file missing" if not path.is_file() else "old text not found"
                problems.append(f"mutant {m.name!r}: {what} in {s.file}: {s.old!r}")
        if not applied and not any(p.startswith(f"mutant {m.name!r}") for p in problems):
            problems.append(f"mutant {m.name!r}: none of its sites found ({', '.join(s.file for s in m.sites)})")
        for t in m.tests:
            if not (tree / t.split("::")[0]).is_file():
                problems.append(f"mutant {m.name!r}: test file {t.split('::')[0]} missing")
        plan[m.name] = applied
    if problems:
        raise SetupError("\n".join(problems))
    return plan


def env_for(tree: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "src")] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"), PYTHONDONTWRITEBYTECODE="1",
               HYPOTHESIS_STORAGE_DIRECTORY=str(tree / ".hypothesis"))
    return env


def check_import(tree: Path, python: str) -> None:
    got = subprocess.run([python, "-c", "import digenrl, sys; sys.stdout.write(digenrl.__file__)"], cwd=tree,
                         env=env_for(tree), capture_output=True, text=True)
    if got.returncode != 0 or not Path(got.stdout).resolve().is_relative_to(tree.resolve()):
        raise SetupError(f"the copy does not import its own src/: digenrl from {got.stdout or got.stderr!r}")


def run_tests(tree: Path, python: str, m: Mutant, timeout: float) -> tuple[int | None, float, str]:
    """(pytest's exit code or None on timeout, seconds, the output's tail)."""
    cmd = [python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *m.tests, *m.extra]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=tree, env=env_for(tree), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return None, time.monotonic() - t0, out[-2000:]
    return p.returncode, time.monotonic() - t0, (p.stdout + p.stderr)[-2000:]


def summary_line(out: str) -> str:
    lines = [x for x in out.strip().splitlines() if x.strip()]
    return lines[-1].strip("= ") if lines else ""


def run(mutants, timeout: float, python: str, baseline: bool, log) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="digenrl-mutants-") as tmp:
        tree = Path(tmp) / "repo"
        copy_tree(ROOT, tree)
        sites = plan_sites(tree, mutants)
        check_import(tree, python)
        base: dict[tuple, tuple] = {}
        results = []
        for m in mutants:
            key = (m.tests, m.extra)
            if baseline and key not in base:
                log(f"baseline: {' '.join(m.tests + m.extra)}")
                base[key] = run_tests(tree, python, m, timeout)
            row = {"name": m.name, "caught": None, "tests": list(m.tests) + list(m.extra),
                   "files": [s.file for s in sites[m.name]], "why": m.why}
            if baseline and base[key][0] != 0:
                rc, _, out = base[key]
                row.update(rc=rc, seconds=0.0, detail=f"baseline failed (rc {rc}): {summary_line(out)}")
                results.append(row)
                log(f"  {m.name}: baseline failed")
                continue
            originals = {}
            try:
                for s in sites[m.name]:
                    path = tree / s.file
                    originals.setdefault(path, path.read_text())
                    path.write_text(path.read_text().replace(s.old, s.new, 1))
                rc, secs, out = run_tests(tree, python, m, timeout)
            finally:
                for path, text in originals.items():
                    path.write_text(text)
            if rc is None:
                caught, detail = True, f"timeout after {timeout:.0f} s"
            elif rc == 5:
                caught, detail = None, "no tests collected"
            else:
                caught, detail = rc != 0, summary_line(out)
            row.update(caught=caught, rc=rc, seconds=round(secs, 1), detail=detail)
            results.append(row)
            log(f"  {m.name}: {'caught' if caught else 'SURVIVED' if caught is False else 'error'} ({secs:.0f} s)")
        return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the results as a JSON list")
    ap.add_argument("--only", action="append", default=[], help="run only this mutant (repeatable; a substring)")
    ap.add_argument("--list", action="store_true", help="print the mutants' names and exit")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per test run (default 600)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unmutated runs of each test set")
    ap.add_argument("--python", default=sys.executable, help="interpreter that runs pytest (default: this one)")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.only or any(o in m.name for o in args.only)]
    if args.list:
        for m in chosen:
            print(m.name)
        return 0
    if not chosen:
        print(f"mutants.py: error: no mutant matches {args.only}", file=sys.stderr)
        return 2

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    try:
        results = run(chosen, args.timeout, args.python, not args.no_baseline, log)
    except SetupError as e:
        print(f"mutants.py: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        for r in results:
            state = {True: "caught", False: "SURVIVED", None: "error"}[r["caught"]]
            print(f"{state:9} {r['name']}  [{' '.join(r['tests'])}]  {r['detail']}")
        caught = sum(r["caught"] is True for r in results)
        print(f"{caught}/{len(results)} caught")
    return 0


if __name__ == "__main__":
    sys.exit(main())
