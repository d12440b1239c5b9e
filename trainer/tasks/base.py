"""The shape every built-in task shares (see trainer.tasks)."""
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
    # what its answers must be judged with: the held-out eval's strict accuracy (trainer.evaluation), and a
    # warning for a job whose reward is looser; GET /v1/datasets shows it
    verifiers: list[dict] = field(default_factory=list)
    params: dict[str, str] = field(default_factory=dict)       # data.params this task reads, with meaning
    eval_only: bool = False                                    # an evaluation set (no train split)
    # why ``data.params`` cannot configure this task (None if it can); default: it takes none
    check_params: Callable[[dict[str, Any]], str | None] | None = None

    def params_error(self, params: dict[str, Any]) -> str | None:
        if self.check_params is not None:
            return self.check_params(params)
        return f"builtin:{self.name} takes no data.params (got {', '.join(sorted(params))})" if params else None


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
