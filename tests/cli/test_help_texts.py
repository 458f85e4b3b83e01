"""Every subcommand's ``--help`` is plain text a person reads: no docstring markup (````x````, ``:func:``), no
module docstring in place of a description, and what it says matches the code (``profile --repeats``: the mean)."""

from __future__ import annotations

import re

import pytest

from digenrl.cli import FORWARDED, main

COMMANDS = ["train", "eval", "sample", "pretrain", *FORWARDED]


def _help(capsys, command: str) -> str:
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", COMMANDS)
def test_help_is_plain_text(capsys, command):
    text = _help(capsys, command)
    assert f"usage: digenrl {command}" in text
    assert "``" not in text and not re.search(r":(func|class|mod|meth):", text), text
    assert f"digenrl {command}``" not in text and "\n``" not in text


def test_profile_repeats_say_mean(capsys):
    text = " ".join(_help(capsys, "profile").split())
    assert "their mean is the cost" in text and "median" not in text


def test_top_level_lists_check(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "check" in out and "`" not in out
