"""How a question reaches the model: an optional system turn, a few worked examples, the question with
its answer-format instruction — chat messages the tokenizer's chat template renders.

Worked examples (``data.few_shot: k``) come from the TRAIN split, chosen once with ``data.seed`` and the
same for every prompt, so held-out questions never appear in a prompt and every prompt shares one prefix
(the rollout engine prefills a shared prefix once). With none of these set a question stays as it is.
"""
from __future__ import annotations

import random
from typing import Any

Sample = dict[str, Any]


class PromptError(ValueError):
    pass


def _shot_answer(task, s: Sample) -> str:
    if task is not None and task.shot_answer is not None:
        return task.shot_answer(s)
    if isinstance(s["reference"], str):
        return s["reference"]
    raise PromptError("data.few_shot needs worked answers: this dataset's references are not text "
                      "(use a built-in task, or string references)")


def format_prompts(train: list[Sample], held: list[Sample], task, cfg) -> tuple[list[Sample], list[Sample]]:
    instruction = cfg.instruction if cfg.instruction is not None else (task.instruction if task else "")
    if not (cfg.system_prompt or cfg.few_shot or instruction):
        return train, held
    if cfg.few_shot > len(train):
        raise PromptError(f"data.few_shot = {cfg.few_shot} but the train split has {len(train)} problems")
    shots = random.Random(f"shots:{cfg.seed}").sample(train, cfg.few_shot) if cfg.few_shot else []

    def ask(q: Any) -> list[dict[str, str]]:
        if isinstance(q, list):  # already chat messages: add the instruction to the last user turn
            msgs = [dict(m) for m in q]
            last = max(i for i, m in enumerate(msgs) if m.get("role") == "user")
            msgs[last]["content"] = _with(msgs[last]["content"], instruction)
            return msgs
        return [{"role": "user", "content": _with(q, instruction)}]

    head: list[dict[str, str]] = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
    for s in shots:
        head += ask(s["prompt"]) + [{"role": "assistant", "content": _shot_answer(task, s)}]

    def fmt(rows: list[Sample]) -> list[Sample]:
        return [{**s, "question": s["prompt"], "prompt": head + ask(s["prompt"])} for s in rows]

    return fmt(train), fmt(held)


def _with(question: str, instruction: str) -> str:
    return f"{question}\n\n{instruction}" if instruction else question
