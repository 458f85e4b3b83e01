"""The task interface: a source of training prompts per step and a fixed evaluation prompt set.

``train_prompts(step, n, seed)`` must depend only on its arguments (so every executor and every mode sees the
same prompts for step k), and each returned ``Prompt`` has a ``uid`` unique inside the step.
"""

from __future__ import annotations

from typing import Protocol

from digenrl.rollout.records import Prompt


class Task(Protocol):
    name: str

    def train_prompts(self, step: int, n: int, seed: int) -> list[Prompt]: ...

    def eval_prompts(self, n: int) -> list[Prompt]: ...


def build_task(task_cfg) -> Task:
    """Build the task named by ``task.name`` (``digits`` or ``text``)."""
    if task_cfg.name == "digits":
        from digenrl.tasks.digits import DigitsTask

        return DigitsTask()
    if task_cfg.name == "text":
        if not task_cfg.prompts_file:
            raise ValueError("task.prompts_file: required when task.name is 'text'")
        from digenrl.tasks.text_prompts import TextPromptTask

        return TextPromptTask(task_cfg.prompts_file, task_cfg.eval_prompts_file)
    raise ValueError(f"task.name: unknown task {task_cfg.name!r}; expected 'digits' or 'text'")
