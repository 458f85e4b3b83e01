"""Policy adapters: the built-in tiny DiT and the diffusers transformer families, behind one interface.

The names below load ``models.base`` (torch) on first use, so the torch-free modules of this package (the model
registry ``models.specs`` and its closed forms ``models.flops``) import without torch."""

_BASE = ("Cond", "Policy", "cat_cond", "guided_velocity")


def __getattr__(name: str):
    if name in _BASE:
        from digenrl.models import base

        return getattr(base, name)
    raise AttributeError(f"module 'digenrl.models' has no attribute {name!r}")


__all__ = list(_BASE)
