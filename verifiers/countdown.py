"""``countdown``: reach the target with the given numbers, each at most once, using + - * / and parentheses.

Equal value is not enough (``309`` "equals" 309): the answer must be an arithmetic expression over the
given numbers only. Parsed with ``ast`` (only number literals, the four operators, unary minus and
parentheses pass; nothing is evaluated by Python), computed in exact fractions, so 7/2*2 is 7 and a
division by zero is a wrong answer rather than a crash. The answer is read from ``\\boxed{}`` (or an
``<answer>`` tag, or the last line). Reference: ``{"numbers": [...], "target": n}`` (reasoning-gym's
countdown entries carry them).
"""
from __future__ import annotations

import ast
from collections import Counter
from fractions import Fraction
from typing import Any

from pydantic import Field

from .base import BaseVerifier, Status, Verdict, VerifierConfig

MAX_ANSWER_CHARS = 512
OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
       ast.Div: lambda a, b: a / b}


class BadExpression(ValueError):
    pass


def _value(node: ast.AST, used: list[int]) -> Fraction:
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        return OPS[type(node.op)](_value(node.left, used), _value(node.right, used))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand, used)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    raise BadExpression(f"not allowed in a countdown answer: {ast.unparse(node)[:40]!r}")


def evaluate(expr: str) -> tuple[Fraction, list[int]]:
    """(exact value, numbers used) of an arithmetic expression; BadExpression if it is anything else."""
    if len(expr) > MAX_ANSWER_CHARS:
        raise BadExpression("answer too long")
    expr = expr.replace("×", "*").replace("÷", "/").replace("\\times", "*").replace("\\div", "/")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError) as e:
        raise BadExpression(f"not an expression: {e}") from None
    used: list[int] = []
    try:
        return _value(tree.body, used), used
    except ZeroDivisionError:
        raise BadExpression("division by zero") from None


class CountdownVerifier(BaseVerifier):
    name = "countdown"
    version = "1"
    description = "An arithmetic expression over the given numbers (each at most once) that equals the target."

    class Config(VerifierConfig):
        use_all: bool = Field(False, description="Every given number must be used (reasoning-gym's wording "
                              "says 'using all', its scorer accepts a subset; default: a subset is fine).")

    def verify(self, completion: str, reference: Any) -> Verdict:
        from .math.extract import extract_answer

        try:
            numbers, target = list(map(int, reference["numbers"])), Fraction(reference["target"])
        except (TypeError, KeyError, ValueError) as e:
            return Verdict(0.0, Status.error, f"bad reference (needs numbers and target): {e!r}")
        answer, _how = extract_answer(completion)
        if answer is None:
            lines = [x for x in completion.strip().splitlines() if x.strip()]
            answer = lines[-1] if lines else None
        if answer is None:
            return Verdict(0.0, Status.unparseable, "no answer")
        answer = answer.split("=")[0]  # "94*4 - 61 - 6 = 309": the expression is the left side
        try:
            value, used = evaluate(answer)
        except BadExpression as e:
            return Verdict(0.0, Status.unparseable, str(e))
        extra = Counter(used) - Counter(numbers)
        if extra:
            return Verdict(0.0, Status.wrong, f"uses numbers not given (or too often): {sorted(extra.elements())}")
        if self.config.use_all and Counter(used) != Counter(numbers):
            return Verdict(0.0, Status.wrong, "does not use every number")
        if value != target:
            return Verdict(0.0, Status.wrong, f"the expression makes {value}, not {target}")
        return Verdict(1.0, Status.correct, "reaches the target with the given numbers")
