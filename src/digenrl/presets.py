"""The shipped presets: ``src/digenrl/configs/<name>.yaml`` in the package (so a wheel has them), addressed as
``--config preset:<name>`` by every subcommand that takes a config. (The repository's ``configs/`` is a link to
the same directory.)"""

from __future__ import annotations

from pathlib import Path

PRESET_DIR = Path(__file__).resolve().parent / "configs"
PREFIX = "preset:"


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    """The file of preset ``name``; ``ValueError`` naming the close names and every preset otherwise."""
    from digenrl.model_options import did_you_mean

    path = PRESET_DIR / f"{name}.yaml"
    if "/" in name or not path.is_file():
        names = preset_names()
        raise ValueError(f"--config: no preset {name!r}{did_you_mean(name, names, PREFIX) or ';'} the presets: "
                         f"{', '.join(PREFIX + n for n in names)}")
    return path
