"""One override syntax across subcommands (issue 24, item 6): ``KEY=VALUE`` positionals and ``--set KEY=VALUE``
both work for train / eval / sample / simulate / plan, before or after the flags; an argument that is neither
a flag nor an override is refused (exit 2); every flag of every subcommand has help text."""

from __future__ import annotations

import argparse

import pytest

from digenrl import cli
from digenrl.cli_args import parse_with_overrides


def test_train_takes_set_and_positionals_anywhere(tmp_path, capsys):
    run = tmp_path / "run"
    args = cli.build_parser()
    ns = cli.parse_args(["train", "steps=1", "--overwrite", f"run_dir={run}", "--set", "seed=3", "log.progress=false"])
    assert ns.overwrite and ns.overrides == ["steps=1", f"run_dir={run}", "log.progress=false", "seed=3"]
    ns = cli.parse_args(["eval", "--set", "eval.num_prompts=2", "seed=1"])
    assert ns.overrides == ["seed=1", "eval.num_prompts=2"]
    assert args is not None


def test_stray_argument_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        cli.parse_args(["train", "steps=1", "--overwrite", "oops"])
    assert e.value.code == 2 and "oops" in capsys.readouterr().err


def test_a_real_train_with_mixed_syntax(tmp_path):
    run = tmp_path / "run"
    rc = cli.main(["train", f"run_dir={run}", "--set", "steps=1", "--overwrite", "train.prompts_per_step=2",
                   "--set", "log.progress=false", "eval.num_prompts=2", "sampler.num_steps=2", "log.print_every=0"])
    assert rc == 0 and (run / "summary.json").is_file()
    import json

    assert json.loads((run / "summary.json").read_text())["steps"] == 1


@pytest.mark.parametrize("module", ["digenrl.sim.cli", "digenrl.sim.plan_cli"])
def test_simulate_and_plan_take_positionals_too(module):
    import importlib

    ap = importlib.import_module(module).build_parser()
    base = ["--config", "default", "--out", "x.yaml"] if module.endswith("plan_cli") else ["--config", "default"]
    ns = parse_with_overrides(ap, [*base, "runtime.trainers=2", "--set", "steps=3"])
    assert ns.sets == ["runtime.trainers=2", "steps=3"]
    if module.endswith(".cli"):  # an nargs='+' flag does not swallow a following override
        ns = parse_with_overrides(ap, ["--config", "default", "--modes", "naive", "gap", "runtime.trainers=2"])
        assert ns.modes == ["naive", "gap"] and ns.sets == ["runtime.trainers=2"]


@pytest.mark.parametrize("module", ["digenrl.tasks.cache_prompts_cli", "digenrl.runtime.calibrate_cli"])
def test_profile_and_cache_prompts_take_set(module, capsys):
    import importlib

    argv = ["--set", "model.nope=1"] + (["--out", "p.json"] if "calibrate" in module else [])
    rc = importlib.import_module(module).main(argv)
    io = capsys.readouterr()
    assert rc == 2 and "model.nope: unknown key" in io.out + io.err


def test_simulate_positional_reaches_the_config(tmp_path, capsys):
    from digenrl.sim.cli import main as simulate

    # the override is parsed (not "unrecognized") and reaches load_config, which names the bad key
    assert simulate(["--config", "default", "--profile", str(tmp_path / "p.json"), "runtime.nope=2"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized" not in err and ("runtime.nope" in err or "p.json" in err), err


def _recorded_actions(monkeypatch, argv):
    """Every argparse action a subcommand's parser defines, recorded while it prints --help."""
    seen = []
    real = argparse.ArgumentParser.parse_known_args

    def spy(self, args=None, namespace=None):
        seen.append(self)
        return real(self, args, namespace)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", spy)
    with pytest.raises(SystemExit):
        cli.main(argv)
    return seen


@pytest.mark.parametrize("command", ["train", "pretrain", "eval", "sample", "simulate", "plan", "export", "profile",
                                     "cache-prompts", "reward-serve"])
def test_every_flag_has_help(monkeypatch, capsys, command):
    parsers = _recorded_actions(monkeypatch, [command, "--help"])
    missing = []
    for p in parsers:
        for a in p._actions:
            if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not a.help or a.help == argparse.SUPPRESS:
                missing.append(f"{p.prog}: {'/'.join(a.option_strings) or a.dest}")
    assert not missing, missing
    assert "usage:" in capsys.readouterr().out
