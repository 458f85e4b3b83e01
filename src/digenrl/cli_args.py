"""One override syntax for every subcommand: dotted ``KEY=VALUE`` positionals and ``--set KEY=VALUE`` (repeatable)
mean the same, before or after the flags (``digenrl train steps=10 --overwrite run_dir=runs/x --set seed=1``).

``add_overrides(ap)`` declares both; ``parse_with_overrides(ap, argv)`` parses and returns the namespace with
``sets`` and ``overrides`` both holding every override: the positionals in their order, then the ``--set`` ones
(the last value of a key wins). A ``KEY=VALUE`` caught by a flag taking several values (``--modes naive gap
steps=3``) is an override too. Any other stray argument is refused (argparse's exit 2).
"""

from __future__ import annotations

import argparse
import re

_OVERRIDE = re.compile(r"^[A-Za-z_][\w.-]*=")  # a dotted key, then '='


def is_override(arg: str) -> bool:
    return bool(_OVERRIDE.match(arg))


def add_overrides(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the positional ``overrides`` and the repeatable ``--set`` to ``ap``."""
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE", default=[],
                    help="dotted config overrides, e.g. train.lr=1e-4 run_dir=runs/x (values parsed as YAML)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override (repeatable), the same as a positional KEY=VALUE")
    return ap


def merge_overrides(ap: argparse.ArgumentParser, ns: argparse.Namespace, extra: list[str]) -> argparse.Namespace:
    """``ns`` with ``extra`` (arguments argparse left over) and ``KEY=VALUE`` items of multi-value flags moved
    into the overrides; ``ap.error`` (exit 2) for anything else left over."""
    bad = [x for x in extra if not is_override(x)]
    if bad:
        ap.error(f"unrecognized arguments: {' '.join(bad)} (overrides look like KEY=VALUE)")
    moved: list[str] = []
    for a in ap._actions:
        if a.option_strings and a.nargs in ("+", "*") and isinstance(getattr(ns, a.dest, None), list):
            values = getattr(ns, a.dest)
            keep = [v for v in values if not (isinstance(v, str) and is_override(v))]
            if len(keep) < len(values):
                moved += [v for v in values if isinstance(v, str) and is_override(v)]
                setattr(ns, a.dest, keep or a.default)
    merged = [*(getattr(ns, "overrides", None) or []), *moved, *extra, *(getattr(ns, "sets", None) or [])]
    ns.overrides = ns.sets = merged
    return ns


def parse_with_overrides(ap: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    ns, extra = ap.parse_known_args(argv)
    return merge_overrides(ap, ns, extra)
