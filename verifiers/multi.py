"""The ``multi`` verifier: several sub-verifiers combined by a weighted sum or an arithmetic formula.

The formula is parsed with :mod:`ast` and checked against a whitelist (numbers, sub-verifier names,
``+ - * / **``, unary minus, ``min``, ``max``, ``abs``, ``clip(x, lo, hi)``) when the config is built;
it is then evaluated by walking that tree. Nothing is ever passed to ``eval``/``exec``, so a formula
cannot reach attributes, subscripts, imports or any other name.
"""
from __future__ import annotations

import ast
import math
import operator
from typing import Any, Callable, Sequence

from pydantic import Field, field_validator, model_validator

from .base import BaseVerifier, Status, Verdict, VerifierConfig, sandbox_seconds
from .spec import VerifierSpec

_BINOPS: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[float], float]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_FUNCS: dict[str, tuple[Callable[..., float], int, int | None]] = {  # name -> (fn, min args, max args)
    "min": (min, 1, None), "max": (max, 1, None), "abs": (abs, 1, 1),
    "clip": (lambda x, lo, hi: min(max(x, lo), hi), 3, 3),
}
MAX_FORMULA_CHARS = 1000
MAX_DEPTH = 50


class FormulaError(ValueError):
    pass


def parse_formula(text: str, names: Sequence[str]) -> ast.Expression:
    """Parse and whitelist-check ``text``; raises :class:`FormulaError` naming the offending part."""
    if len(text) > MAX_FORMULA_CHARS:
        raise FormulaError(f"formula is longer than {MAX_FORMULA_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise FormulaError(f"formula is not an expression: {e.msg}") from None
    allowed = set(names)
    if _depth(tree.body) > MAX_DEPTH:  # the evaluator recurses; keep it far from the recursion limit
        raise FormulaError(f"formula nests deeper than {MAX_DEPTH} levels")
    callees = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Expression, ast.Load, *_BINOPS, *_UNARY)):
            continue
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            continue
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            continue
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            continue
        if isinstance(node, ast.Name):
            if node.id in allowed or (node.id in _FUNCS and id(node) in callees):
                continue
            raise FormulaError(f"unknown name {node.id!r} in formula; sub-verifiers: {', '.join(names)}")
        if isinstance(node, ast.Call):
            fn = node.func.id if isinstance(node.func, ast.Name) else None
            if fn in _FUNCS and not node.keywords and not any(isinstance(a, ast.Starred) for a in node.args):
                _, lo, hi = _FUNCS[fn]
                if len(node.args) < lo or (hi is not None and len(node.args) > hi):
                    raise FormulaError(f"{fn}() takes {lo}{'' if hi == lo else '+'} arguments")
                continue
            raise FormulaError(f"only {', '.join(_FUNCS)} may be called in a formula")
        raise FormulaError(f"{type(node).__name__} is not allowed in a formula "
                           f"(numbers, names, + - * / **, min, max, abs, clip)")
    return tree


def _depth(node: ast.AST) -> int:
    depth, level = 0, [node]
    while level:  # breadth-first, so a deep tree cannot exhaust the stack here either
        depth += 1
        level = [c for n in level for c in ast.iter_child_nodes(n)]
    return depth


def eval_formula(tree: ast.Expression, values: dict[str, float]) -> float:
    """Evaluate a tree from :func:`parse_formula`; raises ArithmeticError/ValueError on bad maths."""

    def ev(n: ast.AST) -> float:
        if isinstance(n, ast.Constant):
            return float(n.value)
        if isinstance(n, ast.Name):
            return values[n.id]
        if isinstance(n, ast.UnaryOp):
            return _UNARY[type(n.op)](ev(n.operand))
        if isinstance(n, ast.BinOp):
            a, b = ev(n.left), ev(n.right)
            if isinstance(n.op, ast.Pow) and abs(b) > 64:  # keep a typo from costing a huge float power
                raise ValueError("exponent above 64 in formula")
            r = _BINOPS[type(n.op)](a, b)
            if isinstance(r, complex):  # (-1) ** 0.5 is complex in Python
                raise ValueError("formula gave a complex number")
            return float(r)
        if isinstance(n, ast.Call):
            return float(_FUNCS[n.func.id][0](*[ev(a) for a in n.args]))
        raise FormulaError(f"unexpected {type(n).__name__}")  # parse_formula rules this out

    out = ev(tree.body)
    if not math.isfinite(out):
        raise ValueError(f"formula gave {out}")
    return out


class MultiVerifier(BaseVerifier):
    name = "multi"
    version = "1"
    description = ("Combines sub-verifiers: weighted sum of their scores, or `formula` over their labels "
                   "(+ - * / **, min, max, abs, clip). Status error/timeout if any sub-verifier had one.")
    batches = True  # verify_batch is its own (the scorer reads per-call times from verdicts)

    class Config(VerifierConfig):
        verifiers: dict[str, VerifierSpec] = Field(..., min_length=1, max_length=16,
                                                  description="label -> sub-verifier; labels are formula names.")
        formula: str | None = Field(None, description="e.g. `0.8 * correct + 0.2 * min(fmt, brevity)`.")
        correct_threshold: float = Field(1.0, allow_inf_nan=False,
                                         description="Final score at or above this is `correct`.")

        @field_validator("verifiers")
        @classmethod
        def _labels(cls, v: dict[str, VerifierSpec]) -> dict[str, VerifierSpec]:
            for label in v:
                if not label.isidentifier() or label in _FUNCS:
                    raise ValueError(f"label {label!r} must be a Python identifier other than {', '.join(_FUNCS)}")
            return v

        @model_validator(mode="after")
        def _formula(self) -> "MultiVerifier.Config":
            if self.formula is not None:
                parse_formula(self.formula, list(self.verifiers))  # FormulaError is a ValueError: a 422
            return self

    config: Config

    def __init__(self, config: Any = None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        from .registry import get_verifier  # late: the registry imports this module lazily

        self.tree = parse_formula(self.config.formula, list(self.config.verifiers)) if self.config.formula else None
        self.subs = {label: get_verifier(s.name, s.config, version=s.version)
                     for label, s in self.config.verifiers.items()}

    def verify(self, completion: str, reference: Any) -> Verdict:
        return self.verify_batch([completion], [reference])[0]

    def sandbox_seconds(self, reference: Any) -> float:
        return sum(sandbox_seconds(v, reference) for v in self.subs.values())

    def verify_batch(self, completions: Sequence[str], references: Sequence[Any]) -> list[Verdict]:
        if len(completions) != len(references):
            raise ValueError(f"{len(completions)} completions but {len(references)} references")
        per = {label: v.verify_batch(list(completions), list(references)) for label, v in self.subs.items()}
        return [self._combine({label: vs[i] for label, vs in per.items()}) for i in range(len(completions))]

    def _combine(self, sub: dict[str, Verdict]) -> Verdict:
        scores = {label: v.score for label, v in sub.items()}
        details: dict[str, Any] = {"sub_scores": scores, "sub_statuses": {k: v.status.value for k, v in sub.items()}}
        if self.tree is None:
            score = sum(self.config.verifiers[label].weight * s for label, s in scores.items())
        else:
            try:
                score = eval_formula(self.tree, scores)
            except (ArithmeticError, ValueError) as e:
                return Verdict(0.0, Status.error, f"formula failed: {e}", {**details, "error_kind": "runtime_error"})
        for bad in (Status.error, Status.timeout):  # a broken part must not pass for a low score
            failed = [label for label, v in sub.items() if v.status is bad]
            if failed:
                why = "; ".join(f"{label}: {sub[label].reason}" for label in failed)
                return Verdict(score, bad, f"{bad.value} in {', '.join(failed)}: {why}"[:500], details)
        if all(v.status is Status.unparseable for v in sub.values()):
            return Verdict(score, Status.unparseable, "every sub-verifier found nothing to judge", details)
        ok = score >= self.config.correct_threshold - 1e-9  # 0.7 + 0.2 + 0.1 is 0.9999999999999999
        return Verdict(score, Status.correct if ok else Status.wrong, f"score {score:.4g}", details)
