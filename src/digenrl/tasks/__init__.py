"""Prompt sets ("tasks"): which prompts a step trains on and which fixed prompts evaluation uses."""

from digenrl.tasks.base import Task, build_task

__all__ = ["Task", "build_task"]
