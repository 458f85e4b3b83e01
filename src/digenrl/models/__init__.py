"""Policy adapters: the built-in tiny DiT and the diffusers transformer families, behind one interface."""

from digenrl.models.base import Cond, Policy, cat_cond, guided_velocity, index_cond, repeat_cond

__all__ = ["Cond", "Policy", "cat_cond", "guided_velocity", "index_cond", "repeat_cond"]
