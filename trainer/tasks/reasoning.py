"""Math tasks from the ``reasoning-gym`` package (Apache-2.0; procedural, offline): arithmetic, chain sums,
GSM8K-style word problems and countdown, at the difficulty ``data.params`` asks for.

Each task's generator config is reasoning-gym's own dataclass; ``data.params`` fills it (unknown keys are
refused at submission, naming the key), ``data.seed`` seeds it. A reference carries the plain answer (for
our math verifier) and the generator's entry (for reasoning-gym's own ``score_answer``, the
``reasoning_gym`` verifier, so the two can be compared); countdown is judged by our ``countdown``
verifier (the expression must use the given numbers and reach the target, not merely equal it).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from .base import Sample, Task, split_disjoint

BOXED = "Put your final answer in \\boxed{}."
STRICT_MATH = {"name": "math", "config": {"allow_unevaluated": False}}
RG_TASKS = {
    "basic_arithmetic": "Arithmetic expressions with +, -, *, / and parentheses (min/max_terms, min/max_digits).",
    "chain_sum": "Chains of additions and subtractions (min/max_terms, min/max_digits).",
    "gsm_symbolic": "GSM8K-style word problems from symbolic templates (difficulty).",
    "countdown": "Reach a target with the given numbers and + - * / (min/max_numbers, min/max_target, ...).",
}
MAX_POOL = 200_000
DEFAULT_TRAIN = 2_000  # countdown generates ~70 problems/s (it solves each): generate what a job can use


def _rg():
    try:
        import reasoning_gym
    except ImportError as e:
        raise ImportError("reasoning-gym tasks need the `reasoning-gym` package: pip install 'rlvr[tasks]'") from e
    return reasoning_gym


def config_fields(name: str) -> dict[str, str]:
    """The generator's knobs (data.params) with their defaults, for docs and error messages."""
    from reasoning_gym.factory import DATASETS

    cfg = DATASETS[name][1]
    return {f.name: repr(f.default) for f in dataclasses.fields(cfg) if f.name not in ("seed", "size")}


def params_error(name: str, params: dict[str, Any]) -> str | None:
    """Why ``data.params`` cannot configure task ``name`` (None if it can)."""
    from reasoning_gym.factory import DATASETS

    cfg_cls = DATASETS[name][1]
    unknown = sorted(set(params) - {f.name for f in dataclasses.fields(cfg_cls)} | set(params) & {"seed", "size"})
    if unknown:
        return (f"unknown parameter(s) {', '.join(unknown)} for builtin:{name}; known: "
                f"{', '.join(sorted(config_fields(name)))}")
    try:
        cfg_cls(**params, seed=0, size=1).validate()
    except (TypeError, ValueError, AssertionError) as e:
        return f"invalid parameters for builtin:{name}: {e}"
    return None


def _entry(x: dict) -> dict:
    return json.loads(json.dumps({"question": x["question"], "answer": x["answer"], "metadata": x["metadata"]},
                                 default=str))  # plain JSON: references are stored with the rollouts


def _load(name: str):
    def load(cfg) -> tuple[list[Sample], list[Sample]]:
        rg = _rg()
        params = dict(cfg.params or {})
        err = params_error(name, params)
        if err:
            raise ValueError(err)
        train_size = cfg.train_size or DEFAULT_TRAIN
        # a little room for the questions a generator repeats (they are dropped from train, not counted)
        size = min(MAX_POOL, int(1.1 * (cfg.eval_size + train_size)) + 50)
        ds = rg.create_dataset(name, seed=cfg.seed, size=size, **params)
        pool = []
        for i in range(size):
            x = ds[i]
            e = _entry(x)
            ref = {"numbers": x["metadata"]["numbers"], "target": x["metadata"]["target"], "entry": e} \
                if name == "countdown" else {"answer": str(x["answer"]), "entry": e}
            pool.append({"id": f"{name}-{cfg.seed}-{i}", "prompt": x["question"], "reference": ref})
        return split_disjoint(pool, cfg.eval_size, train_size)
    return load


def _shot(s: Sample) -> str:
    ref = s["reference"]
    return f"\\boxed{{{ref['entry']['answer'] if 'entry' in ref else ref['answer']}}}"


TASKS = [
    Task(name, doc, _load(name), instruction=BOXED, shot_answer=_shot,
         # the answer must be stated: each prompt holds an expression equal to its answer (or one sympy evaluates
         # from its numbers), so a grader that does the arithmetic would pay for echoing the question
         verifiers=[{"name": "countdown"}] if name == "countdown" else [STRICT_MATH],
         params={"see": "reasoning-gym's config for this task"},
         check_params=lambda p, name=name: params_error(name, p))
    for name, doc in RG_TASKS.items()
]
